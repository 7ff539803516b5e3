"""The pool_slots table: one row per pooled container (bridge/sandbox/pool.py), shared by every
process of a state root, so a container made by one process can serve a task of another.

A row's states: `filling` (reserved by its filler, the container being made), `idle` (started,
waiting), `claimed` (taken by one task: a compare-and-set from `idle`, so two processes can
never take the same slot), `running` (the task's command was handed to it), `removing` (taken by
whoever removes it). No transition leads back to `idle`: a container serves one task at most.
Each change is one statement or one BEGIN IMMEDIATE transaction."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from bridge.errors import BridgeError
from bridge.store.owners import Owner, process_alive
from bridge.store.sql import marks, read_only

STALE_S = 300.0  # a filling, claimed or removing row this old has a stuck owner
StoreError = sqlite3.Error  # what a change of a row raises when the store fails (locked, full)


class Store(Protocol):
    path: Path

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...

    def query(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]: ...


@dataclass(frozen=True)
class PoolSlot:
    slot_id: str
    shape: str
    state: str
    owner: str | None = None
    host: str | None = None
    pid: int | None = None
    pid_started: float | None = None
    container_id: str | None = None
    memory_mb: int = 0
    created_at: float = 0.0
    updated_at: float | None = None
    expires_at: float | None = None
    task_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    released_at: float | None = None

    def owner_dead(self, now: float) -> bool:
        """Whether whoever holds this row (filling, claimed or removing it) is gone or stuck."""
        if self.state not in ("filling", "claimed", "removing"):
            return False
        since = self.updated_at or self.created_at
        return not process_alive(self.host, self.pid, self.pid_started) or now - since > STALE_S


def _slot(row: sqlite3.Row) -> PoolSlot:
    values = dict(row)
    values["labels"] = json.loads(row["labels"]) if row["labels"] else {}
    values["memory_mb"] = row["memory_mb"] or 0
    return PoolSlot(**values)


class PoolSlots:
    """Rows of the pool_slots table."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def reserve(
        self,
        slot_id: str,
        shape: str,
        owner: Owner,
        memory_mb: int,
        *,
        size: int,
        max_containers: int,
        max_memory_mb: int,
    ) -> bool:
        """Reserve a slot of ``shape`` for ``owner`` to fill, unless the shape already has
        ``size`` idle or filling ones, or the pool's bounds would be passed (idle, filling and
        claimed slots count: not yet a task's, they hold memory of their own)."""
        now = time.time()
        with self.store.transaction() as conn:
            (same,) = conn.execute(
                "SELECT COUNT(*) FROM pool_slots WHERE shape = ? AND state IN ('filling', 'idle')",
                (shape,),
            ).fetchone()
            count, memory = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(memory_mb), 0) FROM pool_slots"
                " WHERE state IN ('filling', 'idle', 'claimed')"
            ).fetchone()
            if same >= size or count >= max_containers or memory + memory_mb > max_memory_mb:
                return False
            conn.execute(
                "INSERT INTO pool_slots (slot_id, shape, state, owner, host, pid, pid_started,"
                " memory_mb, created_at, updated_at) VALUES (?, ?, 'filling', ?, ?, ?, ?, ?, ?, ?)",
                (slot_id, shape, *_who(owner), memory_mb, now, now),
            )
        return True

    def filled(self, slot_id: str, container_id: str, expires_at: float) -> bool:
        """The slot's container is started: it becomes idle (False: it was taken meanwhile)."""
        with self.store.transaction() as conn:
            cur = conn.execute(
                "UPDATE pool_slots SET state = 'idle', container_id = ?, expires_at = ?,"
                " updated_at = ? WHERE slot_id = ? AND state = 'filling'",
                (container_id, expires_at, time.time(), slot_id),
            )
        return cur.rowcount == 1

    def claim(
        self, shape: str, owner: Owner, task_id: str, labels: dict[str, str]
    ) -> PoolSlot | None:
        """Take the oldest unexpired idle slot of ``shape`` for one task: a compare-and-set
        (idle -> claimed) under the write lock, so exactly one claimer gets a slot."""
        now = time.time()
        with self.store.transaction() as conn:
            found = conn.execute(
                "SELECT slot_id FROM pool_slots WHERE shape = ? AND state = 'idle'"
                " AND expires_at > ? ORDER BY created_at LIMIT 1",
                (shape, now),
            ).fetchone()
            if found is None:
                return None
            cur = conn.execute(
                "UPDATE pool_slots SET state = 'claimed', owner = ?, host = ?, pid = ?,"
                " pid_started = ?, task_id = ?, labels = ?, updated_at = ?"
                " WHERE slot_id = ? AND state = 'idle'",
                (*_who(owner), task_id, json.dumps(labels), now, found[0]),
            )
            if cur.rowcount != 1:
                return None
        return self.get(found[0])

    def released(self, slot_id: str, at: float) -> bool:
        """The task's command is being handed to the claimed slot's container (False: the
        slot is no longer claimed, its container not this task's to use)."""
        with self.store.transaction() as conn:
            cur = conn.execute(
                "UPDATE pool_slots SET state = 'running', released_at = ?, updated_at = ?"
                " WHERE slot_id = ? AND state = 'claimed'",
                (at, at, slot_id),
            )
        return cur.rowcount == 1

    def take(self, slot_id: str, owner: Owner, states: Iterable[str]) -> bool:
        """Take the slot for removal, if it is still in one of ``states`` (a compare-and-set:
        an idle slot taken here can no longer be claimed, nor one claimed be taken twice)."""
        wanted = tuple(states)
        places = marks(wanted)
        with self.store.transaction() as conn:
            cur = conn.execute(
                "UPDATE pool_slots SET state = 'removing', owner = ?, host = ?, pid = ?,"
                f" pid_started = ?, updated_at = ? WHERE slot_id = ? AND state IN ({places})",
                (*_who(owner), time.time(), slot_id, *wanted),
            )
        return cur.rowcount == 1

    def drop(self, slot_id: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM pool_slots WHERE slot_id = ?", (slot_id,))

    def get(self, slot_id: str) -> PoolSlot | None:
        rows = self.store.query("SELECT * FROM pool_slots WHERE slot_id = ?", (slot_id,))
        return _slot(rows[0]) if rows else None

    def by_container(self, container_id: str) -> PoolSlot | None:
        rows = self.store.query("SELECT * FROM pool_slots WHERE container_id = ?", (container_id,))
        return _slot(rows[0]) if rows else None

    def running(self) -> list[PoolSlot]:
        """The slots serving a task now, or claimed for one (their container carries the
        pool's labels; these are the labels the task's own container would have had)."""
        rows = self.store.query("SELECT * FROM pool_slots WHERE state IN ('claimed', 'running')")
        return [_slot(r) for r in rows]

    def rows(self) -> list[PoolSlot]:
        return [_slot(r) for r in self.store.query("SELECT * FROM pool_slots ORDER BY created_at")]


def read_slots(path: Path) -> list[PoolSlot]:
    """Every slot, read without writing (nothing from a store not made yet, or older)."""
    if not path.exists():
        return []
    conn = None
    try:
        conn = read_only(path)
        return [_slot(r) for r in conn.execute("SELECT * FROM pool_slots")]
    except sqlite3.Error as exc:
        if "no such table" in str(exc):  # a store from before the pool
            return []
        raise BridgeError(
            f"The store at {path} could not be read for the container pool ({exc}); "
            "check that it is readable here."
        ) from exc
    finally:
        if conn is not None:
            conn.close()


def _who(owner: Owner) -> tuple[str, str, int, float | None]:
    return owner.id, owner.host, owner.pid, owner.pid_started
