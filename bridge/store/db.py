"""Store: one SQLite file (WAL) shared by every bridge process on the host.

Status changes are compare-and-set writes against the transition table in `bridge.models`,
committed in the same transaction as their `task.status` event.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.errors import InvalidTransition, StoreUnavailable, TaskNotFound
from bridge.events import EventData
from bridge.models import TRANSITIONS, Status, allowed_sources
from bridge.records import Event, NewTask, TaskRecord
from bridge.store.encode import encode, new_task_columns
from bridge.store.jobs import Jobs
from bridge.store.leases import JOBS, Leases, Runners
from bridge.store.migrations import MIGRATION_SET, STEPS, migrations
from bridge.store.pool import PoolSlots
from bridge.store.requests import Requests
from bridge.store.rows import (
    JSON_COLUMNS,
    applied_migrations,
    readable,
    rows_of,
    sqlite_uri,
    task_record,
    tasks_query,
)
from bridge.store.rows import artifacts_of as artifact_rows
from bridge.store.sql import insert, marks

if TYPE_CHECKING:
    import sqlite_utils


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def store_writable(path: Path) -> str | None:
    """Why tasks could not be recorded in the store at ``path`` (None: they can), found without
    writing anything: an existing store's write lock is taken and let go; a store not made yet
    needs only a folder this user may write in."""
    if not path.exists():
        folder = next((p for p in path.parents if p.exists()), None)
        if folder is None or not os.access(folder, os.W_OK | os.X_OK):
            return f"{folder} is not writable, so the store cannot be made there"
        return None
    try:
        conn = sqlite3.connect(sqlite_uri(path, "rw"), uri=True, timeout=5, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return str(exc)
    return None


class Store:
    """Tasks, jobs, events, leases and artifacts. Safe to share between threads of one process."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        try:
            self.conn = self._open(str(path))
        except (sqlite3.Error, OSError) as exc:
            raise self._unavailable(path, exc) from exc
        try:
            self._migrate()
        except sqlite3.Error as exc:
            self.conn.close()
            raise self._unavailable(path, exc) from exc
        self.runners = Runners(self)
        self.leases = Leases(self)
        self.jobs = Jobs(self, now_iso, self.event_in)
        self.job_runners = Runners(self, JOBS)
        self.requests = Requests(self, now_iso, self.event_in)
        self.pool = PoolSlots(self)

    @staticmethod
    def _unavailable(path: Path | str, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(
            f"The store {path} cannot be opened for writing ({exc}); let this user write to "
            "its folder, or point WORKER_BRIDGE_HOME at a folder it may write."
        )

    @staticmethod
    def _open(path: str) -> sqlite3.Connection:
        if path != ":memory:":
            Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # A new store is this user's alone, wherever it is (`store:` outside the state
            # root too); SQLite gives its -wal and -shm files the database file's mode.
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
            except OSError:
                pass  # there already, or not to be made here: SQLite's own error says which
        conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            if path != ":memory:":
                conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    @property
    def db(self) -> sqlite_utils.Database:
        """The sqlite-utils view of the connection (imported only when used: migrations)."""
        import sqlite_utils

        return sqlite_utils.Database(self.conn)

    def close(self) -> None:
        self.conn.close()

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE: takes the write lock up front, so read-check-write cannot race."""
        with self._lock:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")

    def generation(self) -> tuple[int, int]:
        """What changes when anything is committed to the store: by another connection
        (`PRAGMA data_version`) or by this one (its count of changed rows). Cheap enough to ask
        in a polling loop before a read that would cost more (`wait_for_leases`)."""
        with self._lock:
            (version,) = self.conn.execute("PRAGMA data_version").fetchone()
            return int(version), self.conn.total_changes

    def _migrate(self) -> None:
        """Apply pending migrations, one process at a time (under the write lock). A store from
        before sqlite-utils' runner had its own `migrations` table: its record moves over."""
        if self._applied() >= {name for name, _ in STEPS}:
            return  # up to date: sqlite-utils is not even imported
        with self.transaction():
            db = self.db
            old = db.table("migrations")
            if old.exists():
                migrations().ensure_migrations_table(db)
                for row in old.rows:
                    db.table("_sqlite_migrations").insert(
                        {
                            "migration_set": MIGRATION_SET,
                            "name": row["name"],
                            "applied_at": row["applied_at"],
                        }
                    )
                old.drop()
            migrations().apply(db)

    def _applied(self) -> set[str]:
        return applied_migrations(self.conn)

    def event_in(self, conn: sqlite3.Connection, task_id: str, kind: str, data: EventData) -> int:
        """Store one event inside the caller's transaction (callers redact ``data`` first)."""
        cur = conn.execute(
            "INSERT INTO events (task_id, kind, at, data) VALUES (?, ?, ?, ?)",
            (task_id, kind, now_iso(), json.dumps(data)),
        )
        return int(cur.lastrowid or 0)

    # -- tasks ------------------------------------------------------------------------------

    def insert_task(
        self,
        task: NewTask,
        event: EventData,
        admit: Callable[[sqlite3.Connection], Exception | None] | None = None,
    ) -> tuple[str, bool]:
        """Insert a new task (status `created`) with its `task.created` event. Returns
        (task_id, created).

        With an idempotency key already used on the same repository, returns the existing task
        instead (created=False); the unique index makes this hold across processes.
        ``admit`` runs in the transaction before the row is written (the circuit breaker): on a
        refusal it returns, the task is not written, what ``admit`` wrote is committed, then raised.
        """
        key = task.spec.idempotency_key
        with self.transaction() as conn:
            if key:
                found = conn.execute(
                    "SELECT task_id FROM tasks WHERE idempotency_key = ? AND repository = ?",
                    (key, task.repository),
                ).fetchone()
                if found:
                    return found[0], False
            refusal = admit(conn) if admit is not None else None
            if refusal is None:
                insert(conn, "tasks", encode(new_task_columns(task, now_iso()), JSON_COLUMNS))
                status = {"from": None, "to": str(Status.CREATED)}
                self.event_in(conn, task.task_id, "task.created", event)
                self.event_in(conn, task.task_id, "task.status", status)
        if refusal is not None:
            raise refusal
        return task.task_id, True

    def query(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]:
        """Run a read under the connection lock (threads share the connection)."""
        with self._lock:
            return rows_of(self.conn, sql, params)

    def load_task(self, task_id: str) -> TaskRecord:
        """The task's record; TaskNotFound naming the id."""
        rows = self.query("SELECT * FROM tasks WHERE task_id = ?", (task_id,))
        if not rows:
            raise TaskNotFound.of(task_id)
        return task_record(rows[0])

    def list_tasks(
        self,
        status: str | None = None,
        limit: int | None = None,
        under: list[str] | None = None,
    ) -> list[TaskRecord]:
        """Tasks newest first; ``under``: only those whose repository is one of these folders
        or inside one."""
        sql, params = tasks_query(status, limit, under)
        return readable(self.query(sql, params), task_record)

    def status(self, task_id: str) -> str:
        """Just the status: what polling loops need, without decoding the whole row."""
        rows = self.query("SELECT status FROM tasks WHERE task_id = ?", (task_id,))
        if not rows:
            raise TaskNotFound.of(task_id)
        return rows[0]["status"]

    def statuses(self, task_ids: list[str]) -> dict[str, str]:
        """task id -> status for those of ``task_ids`` that exist."""
        sql = f"SELECT task_id, status FROM tasks WHERE task_id IN ({marks(task_ids)})"
        return {row["task_id"]: row["status"] for row in self.query(sql, task_ids)}

    def set_phase(self, task_id: str, phase: str) -> bool:
        """Record the phase a runner enters; False when the task is no longer running (e.g.
        cancelled meanwhile), so the runner stops instead of doing the phase's work."""
        with self.transaction() as conn:
            cur = conn.execute(
                "UPDATE tasks SET phase = ?, updated_at = ? WHERE task_id = ?"
                " AND status IN ('running', 'verifying')",
                (phase, now_iso(), task_id),
            )
            return cur.rowcount == 1

    def update_task(self, task_id: str, **fields: Any) -> None:
        """Write non-status fields (results, paths, timings)."""
        if "status" in fields:
            raise ValueError("status changes go through transition()")
        encoded = encode({**fields, "updated_at": now_iso()}, JSON_COLUMNS)
        sets = ", ".join(f"{key} = ?" for key in encoded)
        with self.transaction() as conn:
            conn.execute(f"UPDATE tasks SET {sets} WHERE task_id = ?", (*encoded.values(), task_id))

    def set_status(self, conn: sqlite3.Connection, task_id: str, before: str, after: str) -> None:
        """Inside a caller's transaction: a declared status change and its event."""
        if Status(after) not in TRANSITIONS[Status(before)]:
            raise InvalidTransition(f"'{before}' may not move to '{after}'.")
        conn.execute(
            "UPDATE tasks SET status = ?, updated_at = ? WHERE task_id = ? AND status = ?",
            (after, now_iso(), task_id, before),
        )
        self.event_in(conn, task_id, "task.status", {"from": before, "to": after})

    def transition(
        self,
        task_id: str,
        target: Status,
        *,
        explicit: bool = False,
        expect: set[Status] | None = None,
        event: EventData | None = None,
        **fields: Any,
    ) -> bool:
        """Compare-and-set the status. Returns False (writing nothing) when the task is no longer
        in a status from which ``target`` is allowed (e.g. it was cancelled meanwhile)."""
        sources = allowed_sources(target, explicit=explicit)
        if expect is not None:
            sources = sources & expect
        if not sources:
            raise InvalidTransition(f"No status may move to '{target}'.")
        encoded = encode({**fields, "status": str(target), "updated_at": now_iso()}, JSON_COLUMNS)
        sets = ", ".join(f"{key} = ?" for key in encoded)
        with self.transaction() as conn:
            before = conn.execute(
                "SELECT status FROM tasks WHERE task_id = ?", (task_id,)
            ).fetchone()
            if before is None:
                raise TaskNotFound.of(task_id)
            cur = conn.execute(
                f"UPDATE tasks SET {sets} WHERE task_id = ? AND status IN ({marks(sources)})",
                (*encoded.values(), task_id, *(str(s) for s in sources)),
            )
            if cur.rowcount != 1:
                return False
            self.event_in(
                conn,
                task_id,
                "task.status",
                {"from": before[0], "to": str(target), **(event or {})},
            )
        return True

    # -- events -----------------------------------------------------------------------------

    def add_event(self, task_id: str, kind: str, data: EventData | None = None) -> int:
        """Store one event. Callers redact ``data`` first (see bridge.redact)."""
        with self.transaction() as conn:
            return self.event_in(conn, task_id, kind, data or {})

    def events(
        self, task_id: str | None, after: int = 0, limit: int = 200, kinds: tuple[str, ...] = ()
    ) -> list[Event]:
        """The task's events (every task's and job's when ``task_id`` is None: a live view of
        them all) after ``after`` in order, at most ``limit``; only ``kinds`` when given."""
        sql = "SELECT event_id, task_id, kind, at, data FROM events WHERE event_id > ?"
        params: list[Any] = [after]
        if task_id is not None:
            sql, params = sql + " AND task_id = ?", [*params, task_id]
        if kinds:
            sql += f" AND kind IN ({', '.join('?' for _ in kinds)})"
            params += kinds
        rows = self.query(sql + " ORDER BY event_id LIMIT ?", [*params, limit])
        return [
            Event.model_validate({**row, "data": json.loads(row["data"] or "{}")}) for row in rows
        ]

    def last_event(self) -> int:
        """The newest event id of the store (0 when there is none)."""
        return int(self.query("SELECT max(event_id) AS n FROM events")[0]["n"] or 0)

    def status_and_phase(self, task_id: str) -> tuple[str, str | None]:
        """What a live view's status line shows, without decoding the whole row."""
        rows = self.query("SELECT status, phase FROM tasks WHERE task_id = ?", (task_id,))
        if not rows:
            raise TaskNotFound.of(task_id)
        return rows[0]["status"], rows[0]["phase"]

    def count_events(self, task_id: str, kind: str, after: int = 0) -> int:
        rows = self.query(
            "SELECT count(*) AS n FROM events WHERE task_id = ? AND kind = ? AND event_id > ?",
            (task_id, kind, after),
        )
        return int(rows[0]["n"])

    def last_event_id(self, task_id: str, kind: str) -> int:
        rows = self.query(
            "SELECT max(event_id) AS n FROM events WHERE task_id = ? AND kind = ?", (task_id, kind)
        )
        return int(rows[0]["n"] or 0)

    # -- artifacts --------------------------------------------------------------------------

    def add_artifact(self, task_id: str, name: str, path: Path, size: int, sha256: str) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO artifacts (task_id, name, path, size, sha256, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (task_id, name, str(path), size, sha256, now_iso()),
            )

    def artifacts(self, task_id: str) -> dict[str, str]:
        return self.artifacts_of([task_id]).get(task_id, {})

    def artifacts_of(self, task_ids: list[str]) -> dict[str, dict[str, str]]:
        """task id -> {artifact name: path}, in one query for any number of tasks."""
        return artifact_rows(self.query, task_ids)

    def remove_artifacts(self, task_id: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM artifacts WHERE task_id = ?", (task_id,))
