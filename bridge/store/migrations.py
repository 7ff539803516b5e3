"""Named, forward-only schema migrations. Append new ones; never edit or reorder applied ones."""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils


def _initial(db: sqlite_utils.Database) -> None:
    db["tasks"].create(
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
    db["tasks"].create_index(["idempotency_key"], unique=True)
    db["tasks"].create_index(["status", "priority", "created_at"])
    db["tasks"].create_index(["created_at"])
    # AUTOINCREMENT: event ids are never reused, so a log cursor stays valid.
    db.execute(
        "CREATE TABLE events (event_id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL,"
        " kind TEXT NOT NULL, at TEXT NOT NULL, data TEXT)"
    )
    db["events"].create_index(["task_id", "event_id"])
    db["leases"].create(
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
    db["leases"].create_index(["scope", "expires_at"])
    db["leases"].create_index(["task_id"])
    db["artifacts"].create(
        {"task_id": str, "name": str, "path": str, "size": int, "sha256": str, "created_at": str},
        pk=("task_id", "name"),
    )


MIGRATIONS: list[tuple[str, Callable[[sqlite_utils.Database], None]]] = [
    ("0001_initial", _initial),
]
