"""Named, forward-only schema migrations, applied by sqlite-utils' own `Migrations` runner (which
records them in its `_sqlite_migrations` table). Append new ones; never edit or reorder applied
ones. sqlite-utils is imported only when one is pending: a store that is up to date opens
without it (see Store._migrate)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sqlite_utils


def _initial(db: sqlite_utils.Database) -> None:
    db.table("tasks").create(
        {
            "task_id": str,
            "status": str,
            "worker": str,
            "objective": str,
            "repository": str,
            "base_ref": str,
            "base_commit": str,
            "priority": int,
            "idempotency_key": str,
            "spec": str,  # JSON, exactly as executed (never redacted)
            "config": str,  # JSON, the effective configuration at creation
            "created_at": str,
            "updated_at": str,
            "started_at": str,
            "finished_at": str,
            "phase": str,
            "summary": str,
            "error": str,  # JSON or null
            "verification": str,  # JSON or null
            "changed_files": str,  # JSON list
            "timings": str,  # JSON
            "snapshot_commit": str,
            "branch": str,
            "worktree": str,
            "container_id": str,
            "turn": int,
        },
        pk="task_id",
        not_null={"status", "worker", "objective", "repository", "spec", "created_at"},
    )
    db.table("tasks").create_index(["idempotency_key"], unique=True)
    db.table("tasks").create_index(["status", "priority", "created_at"])
    db.table("tasks").create_index(["created_at"])
    # AUTOINCREMENT: event ids are never reused, so a log cursor stays valid.
    db.execute(
        "CREATE TABLE events (event_id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL,"
        " kind TEXT NOT NULL, at TEXT NOT NULL, data TEXT)"
    )
    db.table("events").create_index(["task_id", "event_id"])
    db.table("leases").create(
        {
            "lease_id": str,
            "scope": str,
            "task_id": str,
            "owner": str,
            "acquired_at": float,
            "expires_at": float,
        },
        pk="lease_id",
        not_null={"scope", "task_id", "owner", "expires_at"},
    )
    db.table("leases").create_index(["scope", "expires_at"])
    db.table("leases").create_index(["task_id"])
    db.table("artifacts").create(
        {"task_id": str, "name": str, "path": str, "size": int, "sha256": str, "created_at": str},
        pk=("task_id", "name"),
    )


STEPS: list[tuple[str, Callable[[sqlite_utils.Database], None]]] = [
    ("0001_initial", _initial),
]


def _runners_and_owners(db: sqlite_utils.Database) -> None:
    """Runner ownership of a task (for claim and crash recovery), the persisted deadline, the
    worker's recorded exit (so a crash between exit and collect loses nothing), and the owner
    process of each lease (so a dead owner on this host frees its capacity at once)."""
    for column, kind in (
        ("runner_id", str),
        ("runner_host", str),
        ("runner_pid", int),
        ("runner_pid_started", float),
        ("runner_expires_at", float),
        ("deadline_at", float),
        ("worker_exit", str),
        ("pruned_at", str),
    ):
        db.table("tasks").add_column(column, kind)
    for column, kind in (("host", str), ("pid", int), ("pid_started", float)):
        db.table("leases").add_column(column, kind)
    db.table("tasks").create_index(["status", "runner_expires_at"])


STEPS.append(("0002_runners_and_owners", _runners_and_owners))


def _follow_ups(db: sqlite_utils.Database) -> None:
    """The messages of follow-up turns (turn N uses follow_ups[N-1])."""
    db.table("tasks").add_column("follow_ups", str)


STEPS.append(("0003_follow_ups", _follow_ups))


def _dropped(db: sqlite_utils.Database) -> None:
    """What the snapshot left out of a worker's files (nested .git, FIFOs...), with why."""
    db.table("tasks").add_column("dropped", str)


STEPS.append(("0004_dropped", _dropped))


def _usage(db: sqlite_utils.Database) -> None:
    """The task's network usage through its gateway (requests, bytes, tokens by model)."""
    db.table("tasks").add_column("usage", str)


STEPS.append(("0005_usage", _usage))


def _session_id(db: sqlite_utils.Database) -> None:
    """The worker CLI's own session (Claude, Codex, OpenCode), which later turns resume."""
    db.table("tasks").add_column("session_id", str)


STEPS.append(("0006_session_id", _session_id))


def _idempotency_per_repository(db: sqlite_utils.Database) -> None:
    """An idempotency key is one repository's: the same key on two repositories names two
    tasks (a key used elsewhere must neither reveal that task nor block this one)."""
    db.execute("DROP INDEX IF EXISTS idx_tasks_idempotency_key")
    db.table("tasks").create_index(
        ["repository", "idempotency_key"], unique=True, if_not_exists=True
    )


STEPS.append(("0007_idempotency_per_repository", _idempotency_per_repository))


def _jobs(db: sqlite_utils.Database) -> None:
    """Jobs (compete, review, fanout, integrate): several tasks advanced by one coordinator,
    which owns its job the way a runner owns a task (the same runner columns). Each task of a
    job names it, with its role (`candidate`, `judge`, `implementer`, `reviewer`...) and a
    label (its slot). A job's events go in the events table under its id."""
    db.table("jobs").create(
        {
            "job_id": str,
            "kind": str,
            "status": str,
            "repository": str,
            "spec": str,  # JSON: the job's arguments and its task spec, as given
            "config": str,  # JSON: the effective configuration at creation (its runner's)
            "result": str,  # JSON: what the coordinator found (candidates, rounds, ...)
            "error": str,  # JSON or null
            "created_at": str,
            "updated_at": str,
            "finished_at": str,
            "runner_id": str,
            "runner_host": str,
            "runner_pid": int,
            "runner_pid_started": float,
            "runner_expires_at": float,
        },
        pk="job_id",
        not_null={"kind", "status", "repository", "spec", "created_at"},
    )
    db.table("jobs").create_index(["created_at"])
    db.table("jobs").create_index(["status", "runner_expires_at"])
    for column in ("job_id", "job_role", "job_label"):
        db.table("tasks").add_column(column, str)
    db.table("tasks").create_index(["job_id"])


STEPS.append(("0008_jobs", _jobs))


def _requests(db: sqlite_utils.Database) -> None:
    """A task's requests: network names the gateway refused (with `on_refused: ask`), and the
    path requests and questions of a worker's final message; each pending until answered or
    expired. `held_outcome`: how the turn that left the task waiting would have ended (a
    denial or the input timeout ends the task with it)."""
    db.table("requests").create(
        {
            "request_id": str,
            "task_id": str,
            "kind": str,  # network | paths | question
            "key": str,  # what makes two requests one (network: host:port)
            "detail": str,  # JSON
            "status": str,  # pending | approved | denied | answered | expired
            "at": str,
            "updated_at": str,
            "attempts": int,
            "turn": int,
            "expires_at": float,
            "answer": str,  # JSON or null
            "delivered_turn": int,  # the turn whose message carried the answer
        },
        pk="request_id",
        not_null={"task_id", "kind", "key", "detail", "status", "at"},
    )
    db.table("requests").create_index(["task_id", "key"], unique=True)
    db.table("requests").create_index(["status", "expires_at"])
    db.table("tasks").add_column("held_outcome", str)


STEPS.append(("0009_requests", _requests))


def _circuits(db: sqlite_utils.Database) -> None:
    """The circuit breaker per worker (bridge/workers/circuit.py): its state (`closed` or `open`, an
    open one half-open from `retry_at`, with the one task let through then in `probe_task`),
    and the failures it counts, one row per task turn (so recording one twice counts once)."""
    db.table("circuits").create(
        {
            "worker": str,
            "state": str,
            "opened_at": float,
            "retry_at": float,
            "probe_task": str,
            "probe_at": float,
            "closed_at": float,  # failures up to here no longer count (a close, a reset)
            "reason": str,  # JSON: the failures that opened it, {count, kinds}
            "updated_at": str,
        },
        pk="worker",
        not_null={"state"},
    )
    db.execute(
        "CREATE TABLE circuit_failures (failure_id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " worker TEXT NOT NULL, task_id TEXT NOT NULL, turn INTEGER NOT NULL,"
        " kind TEXT NOT NULL, at REAL NOT NULL, UNIQUE (task_id, turn))"
    )
    db.table("circuit_failures").create_index(["worker", "at"])


STEPS.append(("0010_circuits", _circuits))


def _pool(db: sqlite_utils.Database) -> None:
    """The container pool's slots (bridge/store/pool.py): one row per pooled container, from
    its reservation (`filling`) through `idle` and its one claim (`claimed`, then `running`
    once the task's command was handed to it) to its removal (`removing`, then no row)."""
    db.table("pool_slots").create(
        {
            "slot_id": str,
            "shape": str,
            "state": str,
            "owner": str,
            "host": str,
            "pid": int,
            "pid_started": float,
            "container_id": str,
            "memory_mb": int,
            "created_at": float,
            "updated_at": float,
            "expires_at": float,
            "task_id": str,
            "labels": str,  # JSON: the claiming task's container labels
            "released_at": float,
        },
        pk="slot_id",
        not_null={"shape", "state", "created_at"},
    )
    db.table("pool_slots").create_index(["shape", "state", "created_at"])
    db.table("pool_slots").create_index(["container_id"])


STEPS.append(("0011_pool", _pool))


def _nodes(db: sqlite_utils.Database) -> None:
    """The cluster's node a task's worker last ran on, and the one its checks ran on
    (docs/cluster.md); NULL on one host."""
    db.table("tasks").add_column("worker_node", str)
    db.table("tasks").add_column("verify_node", str)


STEPS.append(("0012_nodes", _nodes))

MIGRATION_SET = "worker-bridge"


def migrations() -> sqlite_utils.Migrations:
    """The steps as a sqlite-utils migration set."""
    from sqlite_utils import Migrations

    found = Migrations(MIGRATION_SET)
    for name, step in STEPS:
        found(name=name)(step)
    return found
