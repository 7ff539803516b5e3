"""The requests table: what a task's worker asked for (a network name the gateway refused, the
protected paths or the question of its final message), each pending until answered, denied or
expired. Every change of a request is one transaction with its event (`task.request` when it
is raised, `task.answer` when it is answered or expires), so several processes (the runner
hosting the gateway, the CLI or MCP server answering) see one truth."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from bridge.documents import RequestAnswer, RequestDetail, RequestRecord
from bridge.events import EventData
from bridge.store.rows import request_record, requests_of
from bridge.store.sql import marks

RESOLVED = ("approved", "denied", "answered", "expired")
# The statuses of a task that may still raise a request: one raised after a cancel (a gateway
# or a runner still ending) is dropped, so nothing of an ended task waits for an answer.
ASKING = ("queued", "running", "verifying", "waiting_input")


class Store(Protocol):
    """What the requests table needs of the store (bridge/store/db.py's Store)."""

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...

    def query(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]: ...


def _asking(conn: sqlite3.Connection, task_id: str) -> bool:
    row = conn.execute("SELECT status FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    return row is not None and row[0] in ASKING


class Requests:
    """Rows of the requests table, typed as RequestRecord."""

    def __init__(
        self,
        store: Store,
        now: Callable[[], str],
        event: Callable[[sqlite3.Connection, str, str, EventData], int],
    ) -> None:
        self.store = store
        self._now = now
        self._event = event

    # -- raising ------------------------------------------------------------------------------

    def network_attempt(
        self,
        task_id: str,
        host: str,
        port: int,
        *,
        turn: int,
        expires_at: float,
        max_requests: int,
        attempts: int = 1,
    ) -> tuple[str, str | None]:
        """``attempts`` refused attempts to reach ``host:port`` (the gateway counts a storm of
        them in one go): (its request's status, its id). A first attempt raises a pending
        request (`task.request`), unless the task has raised ``max_requests`` network requests
        already (then `("over", None)`); later ones are counted."""
        key = f"network:{host}:{port}"
        with self.store.transaction() as conn:
            if not _asking(conn, task_id):
                return "ended", None
            found = conn.execute(
                "SELECT request_id, status FROM requests WHERE task_id = ? AND key = ?",
                (task_id, key),
            ).fetchone()
            if found is not None:
                conn.execute(
                    "UPDATE requests SET attempts = attempts + ?, updated_at = ?"
                    " WHERE request_id = ?",
                    (attempts, self._now(), found[0]),
                )
                return found[1], found[0]
            (count,) = conn.execute(
                "SELECT count(*) FROM requests WHERE task_id = ? AND kind = 'network'", (task_id,)
            ).fetchone()
            if count >= max_requests:
                return "over", None
            request_id = self._insert(
                conn, task_id, "network", key, {"host": host, "port": port}, turn, expires_at
            )
            if attempts > 1:
                conn.execute(
                    "UPDATE requests SET attempts = ? WHERE request_id = ?", (attempts, request_id)
                )
        return "pending", request_id

    def count_attempts(self, task_id: str, host: str, port: int, attempts: int) -> None:
        """Add ``attempts`` to the request for ``host:port`` (those the gateway counted without
        asking the store each time)."""
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE requests SET attempts = attempts + ?, updated_at = ?"
                " WHERE task_id = ? AND key = ?",
                (attempts, self._now(), task_id, f"network:{host}:{port}"),
            )

    def add(
        self,
        task_id: str,
        kind: str,
        detail: RequestDetail,
        *,
        turn: int,
        expires_at: float,
    ) -> str | None:
        """A request of the worker's final message in ``turn`` (one per turn: a second one of
        the same turn, e.g. a runner redoing it after a crash, is the same request); None when
        the task has ended (a cancel)."""
        with self.store.transaction() as conn:
            if not _asking(conn, task_id):
                return None
            key = f"message:{turn}"
            found = conn.execute(
                "SELECT request_id FROM requests WHERE task_id = ? AND key = ?", (task_id, key)
            ).fetchone()
            if found is not None:
                return found[0]
            return self._insert(conn, task_id, kind, key, detail, turn, expires_at)

    def _insert(
        self,
        conn: sqlite3.Connection,
        task_id: str,
        kind: str,
        key: str,
        detail: RequestDetail,
        turn: int,
        expires_at: float,
    ) -> str:
        request_id = "r" + os.urandom(4).hex()
        now = self._now()
        conn.execute(
            "INSERT INTO requests (request_id, task_id, kind, key, detail, status, at,"
            " updated_at, attempts, turn, expires_at) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?,"
            " 1, ?, ?)",
            (request_id, task_id, kind, key, json.dumps(detail), now, now, turn, expires_at),
        )
        self._event(
            conn,
            task_id,
            "task.request",
            {"request_id": request_id, "kind": kind, "detail": detail},
        )
        return request_id

    # -- reading ------------------------------------------------------------------------------

    def of(self, task_ids: list[str]) -> dict[str, list[RequestRecord]]:
        """task id -> its requests, oldest first, in one query for any number of tasks."""
        return requests_of(self.store.query, task_ids)

    def for_task(self, task_id: str) -> list[RequestRecord]:
        return self.of([task_id]).get(task_id, [])

    def pending_count(self, task_id: str) -> int:
        rows = self.store.query(
            "SELECT count(*) AS n FROM requests WHERE task_id = ? AND status = 'pending'",
            (task_id,),
        )
        return int(rows[0]["n"])

    def approved(self, task_id: str, kind: str) -> list[RequestRecord]:
        rows = self.store.query(
            "SELECT * FROM requests WHERE task_id = ? AND kind = ? AND status = 'approved'"
            " ORDER BY rowid",
            (task_id, kind),
        )
        return [request_record(row) for row in rows]

    # -- answering ----------------------------------------------------------------------------

    def resolve(
        self,
        task_id: str,
        request_id: str,
        status: str,
        answer: RequestAnswer,
        shown: EventData,
        task_in: tuple[str, ...] = (),
    ) -> bool:
        """Compare-and-set a pending request (of a task whose status is one of ``task_in``) to
        ``status`` with its ``answer`` (False: the request was not pending any more, or the
        task had moved on, e.g. a cancel in between), with its `task.answer` event holding
        ``shown`` (the answer redacted)."""
        sql = (
            "UPDATE requests SET status = ?, answer = ?, updated_at = ?"
            " WHERE request_id = ? AND task_id = ? AND status = 'pending'"
        )
        params = [status, json.dumps(answer), self._now(), request_id, task_id]
        if task_in:
            sql += f" AND task_id IN (SELECT task_id FROM tasks WHERE status IN ({marks(task_in)}))"
            params += task_in
        with self.store.transaction() as conn:
            cur = conn.execute(sql, params)
            if cur.rowcount != 1:
                return False
            self._event(
                conn, task_id, "task.answer", {"request_id": request_id, "status": status, **shown}
            )
        return True

    def expire_due(self, now: float | None = None) -> list[str]:
        """Pending requests past their deadline become `expired` (a denial); the tasks they
        belong to."""
        now = time.time() if now is None else now
        # A read first: the sweep runs often, and mostly finds nothing to write.
        if not self.store.query(
            "SELECT 1 FROM requests WHERE status = 'pending' AND expires_at <= ? LIMIT 1", (now,)
        ):
            return []
        with self.store.transaction() as conn:
            due = conn.execute(
                "SELECT request_id, task_id FROM requests WHERE status = 'pending'"
                " AND expires_at <= ?",
                (now,),
            ).fetchall()
            for request_id, task_id in due:
                conn.execute(
                    "UPDATE requests SET status = 'expired', updated_at = ? WHERE request_id = ?",
                    (self._now(), request_id),
                )
                self._event(
                    conn,
                    task_id,
                    "task.answer",
                    {"request_id": request_id, "status": "expired"},
                )
        return sorted({task_id for _, task_id in due})

    def close_pending(self, task_id: str, why: str) -> None:
        """The task ended (a cancel): its pending requests are denied, saying ``why``."""
        with self.store.transaction() as conn:
            due = conn.execute(
                "SELECT request_id FROM requests WHERE task_id = ? AND status = 'pending'",
                (task_id,),
            ).fetchall()
            for (request_id,) in due:
                conn.execute(
                    "UPDATE requests SET status = 'denied', answer = ?, updated_at = ?"
                    " WHERE request_id = ?",
                    (json.dumps({"reason": why}), self._now(), request_id),
                )
                self._event(
                    conn,
                    task_id,
                    "task.answer",
                    {"request_id": request_id, "status": "denied", "reason": why},
                )

    def restart_clocks(self, task_id: str, expires_at: float) -> None:
        """The task starts waiting: its pending requests wait ``expires_at`` at least."""
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE requests SET expires_at = max(coalesce(expires_at, 0), ?)"
                " WHERE task_id = ? AND status = 'pending'",
                (expires_at, task_id),
            )

    def unsettled(self) -> list[str]:
        """Tasks waiting for input with nothing pending (their last answer came while their
        runner was ending, and it died before moving them on)."""
        rows = self.store.query(
            "SELECT task_id FROM tasks t WHERE status = 'waiting_input' AND NOT EXISTS"
            " (SELECT 1 FROM requests r WHERE r.task_id = t.task_id AND r.status = 'pending')"
        )
        return [row["task_id"] for row in rows]

    def undelivered(self, task_id: str) -> list[RequestRecord]:
        """Requests answered (or expired) whose answer no turn has carried to the worker yet."""
        places = marks(RESOLVED)
        rows = self.store.query(
            f"SELECT * FROM requests WHERE task_id = ? AND status IN ({places})"
            " AND delivered_turn IS NULL ORDER BY rowid",
            (task_id, *RESOLVED),
        )
        return [request_record(row) for row in rows]

    def mark_delivered(self, request_ids: list[str], turn: int) -> None:
        with self.store.transaction() as conn:
            for request_id in request_ids:
                conn.execute(
                    "UPDATE requests SET delivered_turn = ? WHERE request_id = ?",
                    (turn, request_id),
                )
