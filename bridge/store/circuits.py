"""The circuits tables: one row per worker whose breaker has a state, and the failures it
counts. Only SQL lives here; what the state means and when it changes is bridge/circuit.py's,
which calls these inside one of the store's BEGIN IMMEDIATE transactions, so a decision and
its write are one compare-and-set across processes."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.store.db import now_iso


@dataclass(frozen=True)
class CircuitRow:
    """A worker's breaker as stored: `closed`, or `open` until ``retry_at`` and half-open
    from then, with ``probe_task`` the one task let through; failures at or before
    ``closed_at`` no longer count."""

    worker: str
    state: str = "closed"
    opened_at: float | None = None
    retry_at: float | None = None
    probe_task: str | None = None
    probe_at: float | None = None
    closed_at: float = 0.0
    reason: dict[str, Any] = field(default_factory=dict)


_COLUMNS = ("state", "opened_at", "retry_at", "probe_task", "probe_at", "closed_at", "reason")


def _row(values: tuple) -> CircuitRow:
    worker, state, opened_at, retry_at, probe_task, probe_at, closed_at, reason = values
    return CircuitRow(
        worker=worker,
        state=state,
        opened_at=opened_at,
        retry_at=retry_at,
        probe_task=probe_task,
        probe_at=probe_at,
        closed_at=closed_at or 0.0,
        reason=json.loads(reason) if reason else {},
    )


_SELECT = "SELECT worker, " + ", ".join(_COLUMNS) + " FROM circuits"


def load(conn: sqlite3.Connection, worker: str) -> CircuitRow:
    """The worker's row, or a closed one when it has none."""
    found = conn.execute(_SELECT + " WHERE worker = ?", (worker,)).fetchone()
    return _row(found) if found else CircuitRow(worker=worker)


def save(conn: sqlite3.Connection, row: CircuitRow) -> None:
    values = [getattr(row, name) for name in _COLUMNS]
    values[-1] = json.dumps(row.reason) if row.reason else None
    marks = ", ".join("?" for _ in range(len(_COLUMNS) + 2))
    conn.execute(
        f"INSERT OR REPLACE INTO circuits (worker, {', '.join(_COLUMNS)}, updated_at)"
        f" VALUES ({marks})",
        (row.worker, *values, now_iso()),
    )


def add_failure(
    conn: sqlite3.Connection, worker: str, task_id: str, turn: int, kind: str, at: float
) -> bool:
    """Record one failure of a task's turn; False when it was recorded already."""
    cur = conn.execute(
        "INSERT OR IGNORE INTO circuit_failures (worker, task_id, turn, kind, at)"
        " VALUES (?, ?, ?, ?, ?)",
        (worker, task_id, turn, kind, at),
    )
    return cur.rowcount == 1


def forget_failures(conn: sqlite3.Connection, worker: str, before: float) -> None:
    """Remove the worker's failures recorded before ``before`` (the table stays bounded)."""
    conn.execute("DELETE FROM circuit_failures WHERE worker = ? AND at < ?", (worker, before))


def failure_kinds(conn: sqlite3.Connection, worker: str, after: float) -> dict[str, int]:
    """The worker's failures after ``after``, counted by kind."""
    rows = conn.execute(
        "SELECT kind, count(*) FROM circuit_failures WHERE worker = ? AND at > ?"
        " GROUP BY kind ORDER BY kind",
        (worker, after),
    ).fetchall()
    return {kind: n for kind, n in rows}


def task_outcome(conn: sqlite3.Connection, task_id: str) -> dict[str, Any] | None:
    """What the breaker reads of a task: worker, status, turn, error and recorded exit (the
    JSON ones decoded); None for no such task."""
    found = conn.execute(
        "SELECT worker, status, turn, error, worker_exit FROM tasks WHERE task_id = ?",
        (task_id,),
    ).fetchone()
    if found is None:
        return None
    worker, status, turn, error, worker_exit = found
    return {
        "task_id": task_id,
        "worker": worker,
        "status": status,
        "turn": turn or 0,
        "error": json.loads(error) if error else None,
        "worker_exit": json.loads(worker_exit) if worker_exit else None,
    }


def read_circuits(path: Path, after: float) -> tuple[dict[str, CircuitRow], dict[str, dict]]:
    """Every stored row, and each worker's failures after ``after`` (and after its own
    close) by kind, read without writing anything: from a read-only connection, and nothing
    at all from a store that does not exist yet (or predates the circuits tables)."""
    if not path.exists():
        return {}, {}
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return {}, {}
    try:
        rows = {r[0]: _row(r) for r in conn.execute(_SELECT).fetchall()}
        counted: dict[str, dict[str, int]] = {}
        for worker, kind, n in conn.execute(
            "SELECT f.worker, f.kind, count(*) FROM circuit_failures f"
            " LEFT JOIN circuits c ON c.worker = f.worker"
            " WHERE f.at > ? AND f.at > coalesce(c.closed_at, 0)"
            " GROUP BY f.worker, f.kind ORDER BY f.kind",
            (after,),
        ):
            counted.setdefault(worker, {})[kind] = n
        return rows, counted
    except sqlite3.OperationalError:  # no such table: a store from before the breaker
        return {}, {}
    finally:
        conn.close()
