"""The store's rows as plain data: which columns hold JSON, how a task or request row is decoded,
the tasks listing's query, and the queries that gather a listing's artifacts and requests. The
Store (db.py) reads through these."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge.store.migrations import MIGRATION_SET
from bridge.store.sql import marks

JSON_COLUMNS = (
    "spec",
    "config",
    "error",
    "verification",
    "changed_files",
    "timings",
    "worker_exit",
    "follow_ups",
    "dropped",
    "usage",
    "held_outcome",
)


def decode_columns(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    """``row`` with its JSON ``columns`` parsed in place (NULL stays None)."""
    for column in columns:
        if row.get(column) is not None:
            row[column] = json.loads(row[column])
    return row


def decode_task(row: dict[str, Any]) -> dict[str, Any]:
    """A tasks row with its JSON columns parsed."""
    return decode_columns(row, JSON_COLUMNS)


def decode_request(row: dict[str, Any]) -> dict[str, Any]:
    """A requests row with its detail and answer parsed."""
    row = dict(row)
    row["detail"] = json.loads(row["detail"] or "{}")
    row["answer"] = json.loads(row["answer"]) if row.get("answer") else None
    return row


def tasks_query(
    status: str | None = None, limit: int | None = None, under: list[str] | None = None
) -> tuple[str, list[Any]]:
    """SQL and parameters of the tasks listing: newest first; ``under``: only those whose
    repository is one of these folders or inside one."""
    where: list[str] = []
    params: list[Any] = []
    if status:
        where.append("status = ?")
        params.append(status)
    if under is not None:
        inside = []
        for folder in under:
            prefix = folder.rstrip("/") + "/"
            inside.append("(repository = ? OR substr(repository, 1, ?) = ?)")
            params += [folder, len(prefix), prefix]
        where.append("(" + (" OR ".join(inside) or "0") + ")")
    sql = "SELECT * FROM tasks"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY created_at DESC, rowid DESC"
    if limit:
        sql += " LIMIT ?"
        params.append(limit)
    return sql, params


def applied_migrations(conn: sqlite3.Connection) -> set[str]:
    """The names of the migrations applied to the store (none for a new or pre-runner one)."""
    try:
        rows = conn.execute(
            "SELECT name FROM _sqlite_migrations WHERE migration_set = ?", (MIGRATION_SET,)
        ).fetchall()
    except sqlite3.OperationalError:  # no such table: a new store, or one from before
        return set()
    return {row[0] for row in rows}


def sqlite_uri(path: Path, mode: str) -> str:
    """SQLite's URI of ``path`` opened in ``mode``, the path percent-encoded: a `?`, `#` or `%`
    in a folder's name would otherwise end the path early and drop the mode."""
    return f"{path.absolute().as_uri()}?mode={mode}"


def rows_of(conn: sqlite3.Connection, sql: str, params: tuple | list = ()) -> list[dict[str, Any]]:
    """Rows as dicts keyed by column name."""
    cur = conn.execute(sql, params)
    names = [c[0] for c in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


Query = Callable[[str, list[Any]], list[dict[str, Any]]]


def artifacts_of(run: Query, task_ids: list[str]) -> dict[str, dict[str, str]]:
    """task id -> {artifact name: path}, in one query (``run``) for any number of tasks."""
    found: dict[str, dict[str, str]] = {}
    sql = f"SELECT task_id, name, path FROM artifacts WHERE task_id IN ({marks(task_ids)})"
    for row in run(sql + " ORDER BY name", task_ids):
        found.setdefault(row["task_id"], {})[row["name"]] = row["path"]
    return found


def requests_of(run: Query, task_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """task id -> its requests (decoded rows), oldest first, in one query (``run``)."""
    found: dict[str, list[dict[str, Any]]] = {}
    if not task_ids:
        return found
    sql = f"SELECT * FROM requests WHERE task_id IN ({marks(task_ids)}) ORDER BY rowid"
    for row in run(sql, task_ids):
        found.setdefault(row["task_id"], []).append(decode_request(row))
    return found
