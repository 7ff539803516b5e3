"""The store's rows: which columns hold JSON, how a task or request row is decoded, the tasks
listing's query, and the queries that gather a listing's artifacts and requests. A row is
sqlite3's `Row` (read by column name) until it is decoded into its record. The Store (db.py)
reads through these."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from bridge.documents import RequestRecord
from bridge.errors import RecordUnreadable
from bridge.records import TaskRecord
from bridge.store.migrations import MIGRATION_SET
from bridge.store.sql import marks

log = logging.getLogger("worker_bridge.store")

Item = TypeVar("Item")
Record = TypeVar("Record")

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


def decode_columns(row: sqlite3.Row, columns: tuple[str, ...]) -> dict[str, object]:
    """``row`` as column -> value, its JSON ``columns`` parsed (NULL stays None)."""
    decoded: dict[str, object] = dict(row)
    for column in columns:
        text = decoded.get(column)
        if text is not None:
            decoded[column] = json.loads(str(text))
    return decoded


def task_record(row: sqlite3.Row) -> TaskRecord:
    """A tasks row as its record; RecordUnreadable (one sentence naming the task and the first
    field that does not read) for a row damaged or written by a version that stored it
    otherwise."""
    try:
        return TaskRecord.model_validate(decode_columns(row, JSON_COLUMNS))
    except (ValidationError, ValueError) as exc:
        raise RecordUnreadable.of(f"Task {row['task_id']}", exc) from exc


def readable(items: Iterable[Item], decode: Callable[[Item], Record]) -> list[Record]:
    """Each row (or record) decoded, one that cannot be (RecordUnreadable) left out with a
    warning: one damaged row does not hide every other task or job from a listing."""
    records = []
    for item in items:
        try:
            records.append(decode(item))
        except RecordUnreadable as exc:
            log.warning("%s It is left out of this listing.", exc)
    return records


def request_record(row: sqlite3.Row) -> RequestRecord:
    """A requests row as its record (its detail and answer parsed)."""
    decoded: dict[str, object] = dict(row)
    decoded["detail"] = json.loads(row["detail"] or "{}")
    decoded["answer"] = json.loads(row["answer"]) if row["answer"] else None
    return RequestRecord.model_validate(decoded)


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


def rows_of(conn: sqlite3.Connection, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]:
    """The rows ``sql`` reads, each read by column name."""
    cur = conn.execute(sql, params)
    cur.row_factory = sqlite3.Row
    return cur.fetchall()


Query = Callable[[str, list[Any]], list[sqlite3.Row]]


def artifacts_of(run: Query, task_ids: list[str]) -> dict[str, dict[str, str]]:
    """task id -> {artifact name: path}, in one query (``run``) for any number of tasks."""
    found: dict[str, dict[str, str]] = {}
    sql = f"SELECT task_id, name, path FROM artifacts WHERE task_id IN ({marks(task_ids)})"
    for row in run(sql + " ORDER BY name", task_ids):
        found.setdefault(row["task_id"], {})[row["name"]] = row["path"]
    return found


def requests_of(run: Query, task_ids: list[str]) -> dict[str, list[RequestRecord]]:
    """task id -> its requests, oldest first, in one query (``run``)."""
    found: dict[str, list[RequestRecord]] = {}
    if not task_ids:
        return found
    sql = f"SELECT * FROM requests WHERE task_id IN ({marks(task_ids)}) ORDER BY rowid"
    for row in run(sql, task_ids):
        found.setdefault(row["task_id"], []).append(request_record(row))
    return found
