"""The jobs table: a job's row (its arguments, its recorded configuration, what its coordinator
found) and its status, written as a compare-and-set like a task's, each change with its event
(`job.status`) in the events table under the job's id."""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, NotRequired, Protocol, cast

from pydantic import ValidationError
from typing_extensions import TypedDict

from bridge.config.settings import Config
from bridge.documents import ErrorDoc, JobFindings, JobSpec
from bridge.errors import JobNotFound, RecordUnreadable
from bridge.events import EventData
from bridge.models import JOB_TERMINAL, JobStatus
from bridge.records import JobRecord
from bridge.store.encode import encode
from bridge.store.rows import decode_columns, readable
from bridge.store.sql import insert, marks

JOB_JSON = ("spec", "config", "result", "error")


class Store(Protocol):
    """What the jobs table needs of the store (bridge/store/db.py's Store)."""

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...

    def query(self, sql: str, params: tuple | list = ()) -> builtins.list[sqlite3.Row]: ...


class NewJob(TypedDict):
    """A job as its maker hands it to the table (status `created`): its arguments and the
    configuration its coordinator will run with."""

    job_id: str
    kind: str
    repository: str
    spec: JobSpec
    config: Config


class JobRow(TypedDict):
    """A row of the jobs table, its JSON columns decoded (`JobRecord` is the row typed; this
    is what `load` and `list` return to the callers that index it)."""

    job_id: str
    kind: str
    status: str
    repository: str
    spec: JobSpec
    config: dict[str, Any]  # the configuration as recorded (a JSON column as stored)
    result: JobFindings
    error: ErrorDoc | None
    created_at: str
    updated_at: str | None
    finished_at: str | None
    runner_id: str | None
    runner_host: NotRequired[str | None]
    runner_pid: NotRequired[int | None]
    runner_pid_started: NotRequired[float | None]
    runner_expires_at: NotRequired[float | None]


def _decode(row: sqlite3.Row) -> JobRow:
    # The row as this table stores it (insert, update and transition write these columns).
    return cast(JobRow, decode_columns(row, JOB_JSON))


def _record(row: sqlite3.Row) -> JobRecord:
    try:
        return JobRecord.model_validate(_decode(row))
    except (ValidationError, ValueError) as exc:
        raise RecordUnreadable.of(f"Job {row['job_id']}", exc) from exc


class Jobs:
    """Rows of the jobs table, as JobRecord (`record`, `records`) or as decoded rows."""

    def __init__(
        self,
        store: Store,
        now: Callable[[], str],
        event: Callable[[sqlite3.Connection, str, str, EventData], int],
    ) -> None:
        self.store = store
        self._now = now
        self._event = event  # (conn, id, kind, data) -> event id, inside a transaction

    def insert(self, job: NewJob, created: EventData) -> None:
        """A new job with its `job.created` event."""
        now = self._now()
        row = {
            **job,
            "status": str(JobStatus.CREATED),
            "config": job["config"].model_dump(mode="json"),
            "result": JobFindings(),
            "created_at": now,
            "updated_at": now,
        }
        with self.store.transaction() as conn:
            insert(conn, "jobs", encode(row, JOB_JSON))
            self._event(conn, job["job_id"], "job.created", created)

    def record(self, job_id: str) -> JobRecord:
        """The job's record; JobNotFound naming the id, RecordUnreadable for a damaged row."""
        return _record(self._row(job_id))

    def records(self, limit: int | None = None) -> builtins.list[JobRecord]:
        """Jobs newest first, as records (a damaged row left out with a warning)."""
        return readable(self._rows(limit), _record)

    def load(self, job_id: str) -> JobRow:
        return _decode(self._row(job_id))

    def _row(self, job_id: str) -> sqlite3.Row:
        rows = self.store.query("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
        if not rows:
            raise JobNotFound.of(job_id)
        return rows[0]

    def list(self, limit: int | None = None) -> builtins.list[JobRow]:
        return [_decode(row) for row in self._rows(limit)]

    def _rows(self, limit: int | None) -> builtins.list[sqlite3.Row]:
        sql = "SELECT * FROM jobs ORDER BY created_at DESC, rowid DESC"
        params: list[Any] = []
        if limit:
            sql += " LIMIT ?"
            params.append(limit)
        return self.store.query(sql, params)

    def update(self, job_id: str, **fields: object) -> None:
        """Write non-status fields (the result so far)."""
        encoded = encode({**fields, "updated_at": self._now()}, JOB_JSON)
        sets = ", ".join(f"{key} = ?" for key in encoded)
        with self.store.transaction() as conn:
            conn.execute(f"UPDATE jobs SET {sets} WHERE job_id = ?", (*encoded.values(), job_id))

    def transition(
        self, job_id: str, target: JobStatus, expect: Iterable[JobStatus], **fields: object
    ) -> bool:
        """Compare-and-set the status from one of ``expect``; False (writing nothing) when the
        job is in none of them (cancelled meanwhile, say)."""
        sources = [str(s) for s in expect]
        if target in JOB_TERMINAL:
            fields.setdefault("finished_at", self._now())
        encoded = encode({**fields, "status": str(target), "updated_at": self._now()}, JOB_JSON)
        sets = ", ".join(f"{key} = ?" for key in encoded)
        with self.store.transaction() as conn:
            before = conn.execute("SELECT status FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if before is None:
                raise JobNotFound.of(job_id)
            cur = conn.execute(
                f"UPDATE jobs SET {sets} WHERE job_id = ? AND status IN ({marks(sources)})",
                (*encoded.values(), job_id, *sources),
            )
            if cur.rowcount != 1:
                return False
            self._event(conn, job_id, "job.status", {"from": before[0], "to": str(target)})
        return True

    def task_ids(self, job_id: str) -> builtins.list[str]:
        """The job's tasks, in the order they were made."""
        rows = self.store.query(
            "SELECT task_id FROM tasks WHERE job_id = ? ORDER BY created_at, rowid", (job_id,)
        )
        return [row["task_id"] for row in rows]
