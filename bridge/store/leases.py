"""Runner claims and leases: who runs a task (or coordinates a job), and how many task
containers may run at once.

A runner claims its task (only one live runner per task) and renews that claim and its leases
with a heartbeat. The same claims serve the jobs table, whose coordinator owns a job the way a
task runner owns a task (`Runners(store, JOBS)`). A lease row is (scope, task, owner,
expires_at); acquiring takes one lease in every scope of the task in one BEGIN IMMEDIATE
transaction, so limits hold across processes.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, TypedDict

from bridge.errors import JobNotFound, TaskNotFound
from bridge.models import JOB_TERMINAL, TERMINAL
from bridge.store.owners import Owner, owner_live
from bridge.store.sql import marks


class Store(Protocol):
    """What claims and leases need of the store (bridge/store/db.py's Store, which builds them:
    named here, not imported, so the two modules do not import each other)."""

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...

    def query(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]: ...

    def set_status(
        self, conn: sqlite3.Connection, task_id: str, before: str, after: str
    ) -> None: ...


class LiveLease(TypedDict):
    """A lease that counts: its scope, its task and the runner that holds it."""

    scope: str
    task_id: str
    owner: str


def _runner_live(row: sqlite3.Row) -> bool:
    return owner_live(
        row["runner_expires_at"], row["runner_host"], row["runner_pid"], row["runner_pid_started"]
    )


@dataclass(frozen=True)
class Owned:
    """A table whose rows are owned by one runner at a time: its name and key column, the
    statuses in which a row is finished (never claimed again), those in which a row whose
    runner is gone is stranded, and the status a first claim moves a `created` row to."""

    table: str
    key: str
    terminal: frozenset[str]
    active: tuple[str, ...]
    started: str
    missing: type[Exception]


TASKS = Owned(
    "tasks",
    "task_id",
    frozenset(TERMINAL),
    ("queued", "running", "verifying"),
    "queued",
    TaskNotFound,
)
# A created job is already meant to run (its maker spawns its coordinator at once), so one whose
# coordinator never claimed it is stranded too; the reservation's compare-and-set keeps a job
# from getting two.
JOBS = Owned(
    "jobs", "job_id", frozenset(JOB_TERMINAL), ("created", "running"), "running", JobNotFound
)


class Runners:
    """The runner that owns each row of one table (tasks by default, or jobs)."""

    def __init__(self, store: Store, owned: Owned = TASKS) -> None:
        self.store = store
        self.owned = owned

    def _holder(self, conn: sqlite3.Connection, row_id: str) -> tuple[str, str | None, bool]:
        """(status, runner id, whether that runner is live) of a row, inside a transaction."""
        table, key = self.owned.table, self.owned.key
        row = conn.execute(
            "SELECT status, runner_id, runner_host, runner_pid, runner_pid_started,"
            f" runner_expires_at FROM {table} WHERE {key} = ?",
            (row_id,),
        ).fetchone()
        if row is None:
            raise self.owned.missing(f"No {table[:-1]} '{row_id}' in this store.")
        status, runner_id, host, pid, started, expires = row
        return status, runner_id, runner_id is not None and owner_live(expires, host, pid, started)

    def _reserved(self, conn: sqlite3.Connection, row_id: str) -> bool:
        """Whether the row's runner is a reservation (`reserve`: no process has claimed it)."""
        row = conn.execute(
            f"SELECT runner_pid FROM {self.owned.table} WHERE {self.owned.key} = ?", (row_id,)
        ).fetchone()
        return row is not None and row[0] is None

    def _set_runner(
        self, conn: sqlite3.Connection, row_id: str, runner: tuple, expires: float
    ) -> None:
        conn.execute(
            f"UPDATE {self.owned.table} SET runner_id = ?, runner_host = ?, runner_pid = ?,"
            f" runner_pid_started = ?, runner_expires_at = ? WHERE {self.owned.key} = ?",
            (*runner, expires, row_id),
        )

    def claim(self, task_id: str, owner: Owner, ttl: float) -> bool:
        """Make ``owner`` the row's only runner, unless another live runner holds it; a
        `created` row moves on (a task to `queued`, a job to `running`) in the same
        transaction, so there is no moment when a claimed one looks unstarted. A reservation
        under the same id is taken over."""
        with self.store.transaction() as conn:
            status, runner_id, live = self._holder(conn, task_id)
            if status in self.owned.terminal or (live and runner_id != owner.id):
                return False
            runner = (owner.id, owner.host, owner.pid, owner.pid_started)
            self._set_runner(conn, task_id, runner, time.time() + ttl)
            if status == "created":
                if self.owned is TASKS:
                    self.store.set_status(conn, task_id, "created", "queued")
                else:
                    conn.execute(
                        f"UPDATE {self.owned.table} SET status = ? WHERE {self.owned.key} = ?",
                        (self.owned.started, task_id),
                    )
        return True

    def reserve(
        self,
        task_id: str,
        runner_id: str,
        ttl: float,
        replacing: str | None,
        *,
        finished_ok: bool = False,
    ) -> bool:
        """Hold the row for a runner process about to start (its pid is not known yet).

        Refused while a live runner holds an unfinished row; otherwise a compare-and-set on the
        runner id the caller saw (``replacing``), so of several processes recovering one row,
        one wins. ``finished_ok``: the task is finished and about to be queued again (follow-up);
        its last runner is done with it, even if it has not released its claim yet.
        """
        with self.store.transaction() as conn:
            status, current, live = self._holder(conn, task_id)
            # A task waiting for an answer has no runner either: its last one is done with it.
            finished = status in self.owned.terminal or (finished_ok and status == "waiting_input")
            if current != replacing or (finished and not finished_ok) or (live and not finished):
                return False
            if finished and live and self._reserved(conn, task_id):
                return False  # another process reserved its next turn first (two answers, an
                # answer and the runner's own look): that one queues it, and only that one
            self._set_runner(conn, task_id, (runner_id, None, None, None), time.time() + ttl)
            return True

    def heartbeat(self, task_id: str, owner: Owner, ttl: float) -> bool:
        """Renew the runner's claim and its leases; False when it no longer owns the row."""
        until = time.time() + ttl
        table, key = self.owned.table, self.owned.key
        with self.store.transaction() as conn:
            cur = conn.execute(
                f"UPDATE {table} SET runner_expires_at = ? WHERE {key} = ? AND runner_id = ?",
                (until, task_id, owner.id),
            )
            conn.execute("UPDATE leases SET expires_at = ? WHERE owner = ?", (until, owner.id))
            return cur.rowcount == 1

    def release(self, task_id: str, owner: Owner) -> None:
        table, key = self.owned.table, self.owned.key
        with self.store.transaction() as conn:
            conn.execute(
                f"UPDATE {table} SET runner_expires_at = 0 WHERE {key} = ? AND runner_id = ?",
                (task_id, owner.id),
            )
            conn.execute("DELETE FROM leases WHERE owner = ?", (owner.id,))

    def stranded(self) -> list[sqlite3.Row]:
        """Unfinished rows past `created` whose runner is gone (expired, or dead here); each
        row's id is under the table's key (`task_id` or `job_id`)."""
        places = marks(self.owned.active)
        extra = ", phase" if self.owned is TASKS else ""
        rows = self.store.query(
            f"SELECT {self.owned.key}, status{extra}, runner_id, runner_host, runner_pid,"
            f" runner_pid_started, runner_expires_at FROM {self.owned.table}"
            f" WHERE status IN ({places})",
            self.owned.active,
        )
        return [row for row in rows if not _runner_live(row)]


class Leases:
    """Capacity: one lease per scope (`global`, `repo:<path>`, `worker:<name>`) per task."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _sweep(self, conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
        """Leases that count (scope, task_id, owner), sweeping the rest.

        A lease whose owner died (expired, or its pid gone here) is free, unless its task may
        still have a container running (`container_id` set on an unfinished task): that
        container still uses the capacity until a recovering runner takes the lease over or
        the task ends.
        """
        rows = conn.execute(
            "SELECT l.lease_id, l.scope, l.task_id, l.owner, l.host, l.pid, l.pid_started,"
            " l.expires_at, t.status, t.container_id FROM leases l"
            " LEFT JOIN tasks t ON t.task_id = l.task_id"
        ).fetchall()
        counted = []
        for lease_id, scope, task_id, owner, host, pid, started, expires, status, cid in rows:
            alive = owner_live(expires, host, pid, started)
            busy = cid is not None and status in ("running", "verifying")
            if alive or busy:
                counted.append((scope, task_id, owner))
            else:
                conn.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
        return counted

    def acquire(
        self,
        task_id: str,
        owner: Owner,
        scopes: dict[str, int],
        ttl: float,
        waiting: list[tuple[str, dict[str, int]]] | None = None,
    ) -> bool:
        """Take one lease in every scope (scope -> limit) atomically, or none.

        ``waiting`` lists the tasks queued ahead of this one (task id, scopes), in the order they
        should start; a slot they could use goes to them first. Expired leases and leases of
        owners that died on this host are free.
        """
        now = time.time()
        with self.store.transaction() as conn:
            used: dict[str, int] = {}
            for scope, holder, _ in self._sweep(conn):
                if holder != task_id:
                    used[scope] = used.get(scope, 0) + 1
            for ahead, their_scopes in waiting or []:
                if ahead == task_id:
                    break
                if all(used.get(s, 0) < limit for s, limit in their_scopes.items()):
                    for s in their_scopes:
                        used[s] = used.get(s, 0) + 1
            if any(used.get(scope, 0) >= limit for scope, limit in scopes.items()):
                return False
            conn.execute("DELETE FROM leases WHERE task_id = ? AND owner != ?", (task_id, owner.id))
            for scope in scopes:
                conn.execute(
                    "INSERT INTO leases (lease_id, scope, task_id, owner, acquired_at, expires_at,"
                    " host, pid, pid_started) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        uuid.uuid4().hex,
                        scope,
                        task_id,
                        owner.id,
                        now,
                        now + ttl,
                        owner.host,
                        owner.pid,
                        owner.pid_started,
                    ),
                )
        return True

    def queued_waiting(self) -> list[sqlite3.Row]:
        """Queued tasks with a live runner, in start order: priority (high first), then age."""
        rows = self.store.query(
            "SELECT task_id, worker, repository, priority, runner_host, runner_pid,"
            " runner_pid_started, runner_expires_at FROM tasks WHERE status = 'queued'"
            " ORDER BY priority DESC, created_at ASC, rowid ASC"
        )
        return [row for row in rows if _runner_live(row)]

    def release(self, task_id: str, owner: Owner | None = None) -> None:
        with self.store.transaction() as conn:
            if owner:
                conn.execute(
                    "DELETE FROM leases WHERE task_id = ? AND owner = ?", (task_id, owner.id)
                )
            else:
                conn.execute("DELETE FROM leases WHERE task_id = ?", (task_id,))

    def release_scope(self, task_id: str, owner: Owner, scope: str) -> None:
        """Give back one scope's lease of the task (a cluster node's slot after a turn)."""
        with self.store.transaction() as conn:
            conn.execute(
                "DELETE FROM leases WHERE task_id = ? AND owner = ? AND scope = ?",
                (task_id, owner.id, scope),
            )

    def live(self, scope: str | None = None) -> list[LiveLease]:
        with self.store.transaction() as conn:
            live = self._sweep(conn)
        return [LiveLease(scope=s, task_id=t, owner=o) for s, t, o in live if scope in (None, s)]
