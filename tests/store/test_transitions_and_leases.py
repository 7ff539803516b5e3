"""The SQLite store: compare-and-set transitions, events, idempotency and leases, on real files."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time

import pytest
from support.tasks import new_job, new_task

from bridge.errors import TaskNotFound
from bridge.models import TERMINAL, TRANSITIONS, Status
from bridge.store import Store
from bridge.store.migrations import MIGRATION_SET, STEPS
from bridge.store.owners import Owner

_row = new_task


@pytest.fixture
def store(workdir):
    s = Store(workdir / "bridge.db")
    yield s
    s.close()


def test_a_new_task_is_stored_with_its_created_and_status_events(store):
    store.insert_task(_row("t1"), {"worker": "mock"})
    assert store.load_task("t1").status == "created"
    kinds = [e.kind for e in store.events("t1")]
    assert kinds == ["task.created", "task.status"]


def test_a_transition_writes_the_status_and_its_event_together(store):
    store.insert_task(_row("t1"), {})
    assert store.transition("t1", Status.QUEUED)
    last = store.events("t1")[-1]
    assert last.kind == "task.status"
    assert last.data == {"from": "created", "to": "queued"}


def test_a_transition_from_a_status_the_table_does_not_allow_writes_nothing(store):
    store.insert_task(_row("t1"), {})
    before = len(store.events("t1"))
    assert not store.transition("t1", Status.SUCCEEDED)  # created -> succeeded is not declared
    assert store.load_task("t1").status == "created"
    assert len(store.events("t1")) == before


def test_cancelled_is_never_overwritten_by_a_finishing_run(store):
    store.insert_task(_row("t1"), {})
    store.transition("t1", Status.QUEUED)
    store.transition("t1", Status.RUNNING)
    assert store.transition("t1", Status.CANCELLED)
    assert not store.transition("t1", Status.SUCCEEDED)
    assert not store.transition("t1", Status.FAILED)
    assert not store.transition("t1", Status.VERIFYING)
    assert store.load_task("t1").status == "cancelled"


def test_terminal_statuses_are_left_only_for_accept_reject_or_an_explicit_follow_up(store):
    for status in TERMINAL:
        targets = TRANSITIONS[status]
        assert targets <= {Status.ACCEPTED, Status.REJECTED, Status.QUEUED}
    store.insert_task(_row("t1"), {})
    store.db.conn.execute("UPDATE tasks SET status = 'succeeded' WHERE task_id = 't1'")
    assert not store.transition("t1", Status.QUEUED)  # not without explicit=True
    assert store.transition("t1", Status.QUEUED, explicit=True)


def test_expect_narrows_the_statuses_a_transition_may_start_from(store):
    store.insert_task(_row("t1"), {})
    assert not store.transition("t1", Status.FAILED, expect={Status.RUNNING})
    assert store.transition("t1", Status.FAILED, expect={Status.CREATED})


def test_an_unknown_task_is_a_clear_error(store):
    with pytest.raises(TaskNotFound, match="tasks list"):
        store.load_task("nope")


def test_event_ids_increase_and_paging_with_after_returns_only_later_events(store):
    store.insert_task(_row("t1"), {})
    for i in range(10):
        store.add_event("t1", "worker.progress", {"line": str(i)})
    events = store.events("t1")
    ids = [e.event_id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    later = store.events("t1", after=ids[4], limit=3)
    assert [e.event_id for e in later] == ids[5:8]


def test_list_tasks_is_newest_first_and_filters_by_status(store):
    for i in range(3):
        store.insert_task(_row(f"t{i}"), {})
    store.transition("t1", Status.QUEUED)
    assert [t.task_id for t in store.list_tasks()] == ["t2", "t1", "t0"]
    assert [t.task_id for t in store.list_tasks(status="queued")] == ["t1"]


def test_an_idempotency_key_returns_the_existing_task(store):
    first, created = store.insert_task(_row("t1", idempotency_key="k"), {})
    second, created_again = store.insert_task(_row("t2", idempotency_key="k"), {})
    assert (first, created) == ("t1", True)
    assert (second, created_again) == ("t1", False)


def _insert_with_key(path: str, task_id: str, queue) -> None:
    s = Store(path)
    queue.put(s.insert_task(_row(task_id, idempotency_key="same"), {})[0])
    s.close()


def test_an_idempotency_key_holds_across_processes(workdir):
    path = str(workdir / "shared.db")
    Store(path).close()
    queue = multiprocessing.get_context("spawn").Queue()
    procs = [
        multiprocessing.get_context("spawn").Process(
            target=_insert_with_key, args=(path, f"t{i}", queue)
        )
        for i in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    ids = {queue.get(timeout=10) for _ in procs}
    assert len(ids) == 1
    assert len(Store(path).list_tasks()) == 1


def _owner(name: str) -> Owner:
    return Owner(id=name)


def test_leases_are_taken_in_every_scope_or_none(store):
    leases = store.leases
    assert leases.acquire("a", _owner("o1"), {"global": 2, "repo:/r": 1}, ttl=30)
    # the repo scope is full, so no global lease is taken either
    assert not leases.acquire("b", _owner("o2"), {"global": 2, "repo:/r": 1}, ttl=30)
    assert len(leases.live("global")) == 1
    assert leases.acquire("c", _owner("o3"), {"global": 2, "repo:/other": 1}, ttl=30)
    assert not leases.acquire("d", _owner("o4"), {"global": 2}, ttl=30)


def test_an_expired_lease_is_free_and_a_renewed_one_is_not(store):
    store.insert_task(_row("a"), {})
    owner = _owner("o1")
    assert store.runners.claim("a", owner, ttl=30)
    assert store.leases.acquire("a", owner, {"global": 1}, ttl=0.5)
    assert store.runners.heartbeat("a", owner, ttl=30)
    assert not store.leases.acquire("b", _owner("o2"), {"global": 1}, ttl=30)
    store.db.conn.execute("UPDATE leases SET expires_at = ?", (time.time() - 1,))
    assert store.leases.acquire("b", _owner("o2"), {"global": 1}, ttl=30)


def test_a_lease_whose_owner_process_died_on_this_host_is_free_at_once(store):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ghost = Owner(id="ghost", pid=dead.pid, pid_started=time.time() - 5)
    assert store.leases.acquire("a", ghost, {"global": 1}, ttl=3600)
    assert store.leases.acquire("b", _owner("o2"), {"global": 1}, ttl=30)


def test_a_live_owners_lease_is_not_taken_over(store):
    assert store.leases.acquire("a", Owner(id="me"), {"global": 1}, ttl=3600)
    assert not store.leases.acquire("b", _owner("o2"), {"global": 1}, ttl=30)


def test_releasing_a_tasks_leases_frees_its_capacity(store):
    store.leases.acquire("a", _owner("o1"), {"global": 1}, ttl=30)
    store.leases.release("a")
    assert store.leases.acquire("b", _owner("o2"), {"global": 1}, ttl=30)


def test_a_free_slot_goes_to_the_task_first_in_line(store):
    waiting = [("high", {"global": 1}), ("low", {"global": 1})]
    assert not store.leases.acquire("low", _owner("o1"), {"global": 1}, ttl=30, waiting=waiting)
    assert store.leases.acquire("high", _owner("o2"), {"global": 1}, ttl=30, waiting=waiting)


def test_a_task_ahead_that_cannot_start_does_not_block_the_queue(store):
    store.leases.acquire("busy", _owner("o0"), {"global": 3, "repo:/a": 1}, ttl=30)
    waiting = [("blocked", {"global": 3, "repo:/a": 1}), ("other", {"global": 3, "repo:/b": 1})]
    assert store.leases.acquire("other", _owner("o2"), waiting[1][1], ttl=30, waiting=waiting)


def test_only_one_runner_claims_a_task_and_a_dead_runners_claim_is_taken_over(store):
    store.insert_task(_row("t"), {})
    assert store.runners.claim("t", Owner(id="first"), ttl=30)
    assert not store.runners.claim("t", Owner(id="second"), ttl=30)
    store.db.conn.execute("UPDATE tasks SET runner_expires_at = ?", (time.time() - 1,))
    assert store.runners.claim("t", Owner(id="second"), ttl=30)


def test_a_reservation_is_a_compare_and_set_on_a_runner_that_is_gone(store):
    store.insert_task(_row("t"), {})
    assert store.runners.reserve("t", "r1", ttl=30, replacing=None)
    assert not store.runners.reserve("t", "r2", ttl=30, replacing=None)  # r1 was seen, not None
    assert not store.runners.reserve("t", "r2", ttl=30, replacing="r1")  # r1 is still live
    store.conn.execute("UPDATE tasks SET runner_expires_at = ?", (time.time() - 1,))
    assert store.runners.reserve("t", "r2", ttl=30, replacing="r1")


def test_a_finished_tasks_next_turn_is_reserved_once_though_two_saw_the_same_runner(store):
    """Two processes that saw the same last runner of a task waiting for input (an answer, and
    the runner's own look once it waits): the first reservation stands, the second is refused
    rather than replacing it, so only the winner queues the turn and launches its runner."""
    store.insert_task(_row("t"), {})
    assert store.runners.claim("t", Owner(id="last"), ttl=30)
    store.transition("t", Status.QUEUED)
    store.transition("t", Status.RUNNING)
    store.transition("t", Status.WAITING_INPUT)
    assert store.runners.reserve("t", "next-a", ttl=30, replacing="last", finished_ok=True)
    assert not store.runners.reserve("t", "next-b", ttl=30, replacing="next-a", finished_ok=True)
    assert store.load_task("t").runner_id == "next-a"
    assert store.runners.claim("t", Owner(id="next-a"), ttl=30)  # the winner's runner starts


def test_claiming_a_created_task_queues_it_in_the_same_transaction(store):
    store.insert_task(_row("t"), {})
    assert store.runners.claim("t", Owner(), ttl=30)
    assert store.load_task("t").status == "queued"
    assert store.events("t")[-1].data == {"from": "created", "to": "queued"}


def test_a_queued_task_without_a_live_runner_is_stranded(store):
    store.insert_task(_row("t"), {})
    store.transition("t", Status.QUEUED)
    assert [r["task_id"] for r in store.runners.stranded()] == ["t"]
    store.runners.claim("t", Owner(), ttl=30)
    assert store.runners.stranded() == []


def test_migrations_are_recorded_and_not_applied_twice(workdir):
    path = workdir / "m.db"
    Store(path).close()
    s = Store(path)
    names = [r[0] for r in s.db.conn.execute("SELECT name FROM _sqlite_migrations ORDER BY id")]
    assert names == [name for name, _ in STEPS]
    assert names[:3] == ["0001_initial", "0002_runners_and_owners", "0003_follow_ups"]
    assert s.db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_store_from_the_hand_written_runner_moves_to_sqlite_utils_migrations(workdir):
    import sqlite3

    path = workdir / "old.db"
    Store(path).close()
    conn = sqlite3.connect(path)  # as the old runner left it: its own table, no sqlite-utils'
    applied = conn.execute("SELECT name, applied_at FROM _sqlite_migrations ORDER BY id").fetchall()
    conn.execute("DROP TABLE _sqlite_migrations")
    conn.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at TEXT)")
    pending = [row for row in applied if row[0] != "0006_session_id"]  # one still pending
    conn.executemany("INSERT INTO migrations VALUES (?, ?)", pending)
    conn.execute("ALTER TABLE tasks DROP COLUMN session_id")
    conn.commit()
    conn.close()
    s = Store(path)
    try:
        rows = s.query("SELECT migration_set, name FROM _sqlite_migrations ORDER BY id")
        assert sorted(r["name"] for r in rows) == sorted(name for name, _ in STEPS)
        assert {r["migration_set"] for r in rows} == {MIGRATION_SET}
        assert "session_id" in s.db["tasks"].columns_dict, "the pending one was applied"
        assert not s.db["migrations"].exists()
    finally:
        s.close()


def test_a_job_whose_coordinator_never_claimed_it_is_stranded_and_reserved_once(tmp_path):
    from bridge.store.owners import Owner

    store = Store(tmp_path / "s.db")
    store.jobs.insert(new_job("j1"), {})
    assert [r["job_id"] for r in store.job_runners.stranded()] == ["j1"]
    assert store.job_runners.reserve("j1", "runner-a", 30, None)
    assert not store.job_runners.reserve("j1", "runner-b", 30, None), "one process wins"
    assert store.job_runners.stranded() == [], "a fresh reservation is live"
    owner = Owner(id="runner-a")
    assert store.job_runners.claim("j1", owner, 10)
    assert store.jobs.load("j1")["status"] == "running"
    store.job_runners.release("j1", owner)
    assert [r["job_id"] for r in store.job_runners.stranded()] == ["j1"]
    store.close()
