"""The circuits tables: one row per worker whose breaker has a state, and the failures it counts.
Only SQL lives here; what the state means and when it changes is bridge/workers/circuit.py's, which
calls these inside one of the store's BEGIN IMMEDIATE transactions, so a decision and its write are
one compare-and-set across processes."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

from bridge.documents import WorkerExit
from bridge.errors import BridgeError
from bridge.models import JsonObject
from bridge.store.db import now_iso
from bridge.store.owners import owner_live
from bridge.store.sql import marks, read_only


class OpenedFor(TypedDict, total=False):
    """Why an open breaker opened, as stored: the failures by kind and the window they fell in
    (empty for a closed one)."""

    kinds: dict[str, int]
    window_s: float


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
    reason: OpenedFor = field(default_factory=lambda: OpenedFor())


@dataclass(frozen=True)
class TaskOutcome:
    """What the breaker reads of a task: where it ran, how it ended (status, turn, error kind
    and the worker's recorded exit), its effective deadline (``timeout_seconds``), when it
    ended (``ended_at``, epoch seconds), whether a runner holds a live claim on it, its
    ``deadline_at``, and the `circuit` section of the configuration it was made with (as
    stored: read by whoever applies it, who falls back to its own for one it cannot read)."""

    task_id: str
    worker: str
    repository: str
    status: str
    turn: int = 0
    error_kind: str | None = None
    worker_exit: WorkerExit | None = None
    timeout_seconds: float | None = None
    ended_at: float | None = None
    runner_live: bool = False
    deadline_at: float | None = None
    circuit: JsonObject | None = None


_COLUMNS = ("state", "opened_at", "retry_at", "probe_task", "probe_at", "closed_at", "reason")


def _row(values: tuple) -> CircuitRow:
    """The stored row; ValueError when it is not one this version wrote (damaged, or another
    version's), which callers say in one sentence rather than read as some state."""
    worker, state, opened_at, retry_at, probe_task, probe_at, closed_at, reason = values
    found: OpenedFor = json.loads(reason) if reason else OpenedFor()
    kinds = found.get("kinds", {}) if isinstance(found, dict) else None
    window = found.get("window_s", 0) if isinstance(found, dict) else None
    numbers = (opened_at, retry_at, probe_at, closed_at, window)
    if (
        not isinstance(kinds, dict)
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in kinds.values())
        or not all(n is None or isinstance(n, int | float) for n in numbers)
    ):
        raise ValueError(f"the circuit row of worker {worker!r} is not one this version reads")
    return CircuitRow(
        worker=worker,
        state=state,
        opened_at=opened_at,
        retry_at=retry_at,
        probe_task=probe_task,
        probe_at=probe_at,
        closed_at=closed_at or 0.0,
        reason=found,
    )


_SELECT = "SELECT worker, " + ", ".join(_COLUMNS) + " FROM circuits"


def load(conn: sqlite3.Connection, worker: str, *, damaged_as_closed: bool = False) -> CircuitRow:
    """The worker's row, or a closed one when it has none (or, with ``damaged_as_closed``,
    one this version cannot read: for `workers reset`, which writes it anew)."""
    found = conn.execute(_SELECT + " WHERE worker = ?", (worker,)).fetchone()
    try:
        return _row(found) if found else CircuitRow(worker=worker)
    except ValueError as exc:
        if damaged_as_closed:
            return CircuitRow(worker=worker)
        raise BridgeError(
            f"The circuit breaker of worker '{worker}' could not be read ({exc}); "
            f"`worker-bridge workers reset {worker}` writes it anew."
        ) from exc


def save(conn: sqlite3.Connection, row: CircuitRow) -> None:
    values = [getattr(row, name) for name in _COLUMNS]
    values[-1] = json.dumps(row.reason) if row.reason else None
    places = marks(range(len(_COLUMNS) + 2))
    conn.execute(
        f"INSERT OR REPLACE INTO circuits (worker, {', '.join(_COLUMNS)}, updated_at)"
        f" VALUES ({places})",
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


def failure_repositories(conn: sqlite3.Connection, worker: str, after: float) -> int:
    """How many repositories the worker's failures after ``after`` came from."""
    found = conn.execute(
        "SELECT count(DISTINCT t.repository) FROM circuit_failures f"
        " JOIN tasks t ON t.task_id = f.task_id WHERE f.worker = ? AND f.at > ?",
        (worker, after),
    ).fetchone()
    return int(found[0] or 0)


def repositories_used(conn: sqlite3.Connection, worker: str, after: float) -> int:
    """How many repositories the worker ran in (a task with an exit recorded) made or ended
    after ``after``: a task it never ran (cancelled before, or not started) says nothing."""
    since = _iso(after)
    found = conn.execute(
        "SELECT count(DISTINCT repository) FROM tasks WHERE worker = ?"
        " AND worker_exit IS NOT NULL AND (created_at > ? OR finished_at > ?)",
        (worker, since, since),
    ).fetchone()
    return int(found[0] or 0)


def _error_kind(text: str | None) -> str | None:
    try:
        error = json.loads(text) if text else None
    except ValueError:
        return None
    kind = error.get("kind") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None


def _worker_exit(text: str | None) -> WorkerExit | None:
    """The recorded worker exit; None when there is none or it does not read (a damaged row is
    an outcome that says nothing, not a breaker that cannot decide)."""
    try:
        return WorkerExit.model_validate_json(text) if text else None
    except ValueError:  # pydantic's ValidationError is one
        return None


def _iso(at: float) -> str:  # the form of the tasks' timestamps (store.db.now_iso)
    return datetime.fromtimestamp(max(at, 0.0), UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def task_outcome(conn: sqlite3.Connection, task_id: str) -> TaskOutcome | None:
    """The task's outcome as the breaker reads it; None for no such task."""
    found = conn.execute(
        "SELECT worker, repository, status, turn, error, worker_exit, finished_at,"
        " json_extract(config, '$.effective_limits.timeout_seconds'),"
        " json_extract(config, '$.circuit'), runner_id, runner_host, runner_pid,"
        " runner_pid_started, runner_expires_at, deadline_at FROM tasks WHERE task_id = ?",
        (task_id,),
    ).fetchone()
    if found is None:
        return None
    worker, repository, status, turn, error, worker_exit, finished_at, deadline = found[:8]
    circuit, runner_id, host, pid, pid_started, expires, deadline_at = found[8:]
    try:
        ended_at = datetime.fromisoformat(finished_at).timestamp() if finished_at else None
    except ValueError:
        ended_at = None
    return TaskOutcome(
        task_id=task_id,
        worker=worker,
        repository=repository,
        status=status,
        turn=turn or 0,
        error_kind=_error_kind(error),
        worker_exit=_worker_exit(worker_exit),
        timeout_seconds=deadline,
        ended_at=ended_at,
        runner_live=runner_id is not None and owner_live(expires, host, pid, pid_started),
        deadline_at=deadline_at,
        circuit=json.loads(circuit) if circuit else None,
    )


def read_circuits(
    path: Path, after: float
) -> tuple[dict[str, CircuitRow], dict[str, dict[str, int]], dict[str, TaskOutcome | None]]:
    """Every stored row, each worker's failures after ``after`` (and after its own close) by
    kind, and for each row with a probe the probe task as task_outcome reads it (None: the
    task is gone), read without writing anything: from a read-only connection, and nothing at
    all from a store that does not exist yet (or predates the circuits tables)."""
    if not path.exists():
        return {}, {}, {}
    try:
        conn = read_only(path)
    except sqlite3.Error as exc:
        raise _unreadable(path, exc) from exc
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
        probes = {
            name: task_outcome(conn, row.probe_task) for name, row in rows.items() if row.probe_task
        }
        return rows, counted, probes
    except sqlite3.Error as exc:
        if "no such table" in str(exc):  # a store from before the breaker
            return {}, {}, {}
        raise _unreadable(path, exc) from exc  # not "all closed": that would be a guess
    except ValueError as exc:  # a row this version cannot read: said, never a traceback
        raise _unreadable(path, exc) from exc
    finally:
        conn.close()


def _unreadable(path: Path, exc: Exception) -> BridgeError:
    return BridgeError(
        f"The store at {path} could not be read for the workers' circuit breakers ({exc}); "
        "check that it is readable here."
    )
