"""A stored row this version cannot read (damaged by hand, or written by a version that stored
it otherwise) is one clear sentence when asked for by id, and is left out of a listing with a
warning instead of taking every other task or job down with it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from support.tasks import new_job

from bridge.errors import RecordUnreadable
from bridge.store import Store
from bridge.store.circuits import task_outcome


def damage(db: Path, table: str, key: str, row_id: str, column: str, text: str) -> None:
    """Write ``text`` into one column the way a hand edit or a foreign version would."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (text, row_id))
    conn.close()


def test_a_damaged_task_is_one_sentence_by_id_and_left_out_of_the_list(cli, home, repo):
    made = [
        cli("tasks", "create", "--repo", str(repo), "--objective", name, "--worker", "mock")
        for name in ("kept", "damaged")
    ]
    assert all(r.code == 0 for r in made), [r.stderr for r in made]
    kept, damaged = (r.stdout.strip() for r in made)
    damage(home / "bridge.db", "tasks", "task_id", damaged, "spec", '{"objective": 7}')

    shown = cli("tasks", "show", damaged)
    assert shown.code == 1, (shown.stdout, shown.stderr)
    lines = shown.stderr.strip().splitlines()
    assert len(lines) == 1 and damaged in lines[0] and "cannot be read" in lines[0], lines

    listed = cli("tasks", "list", "--json")
    assert listed.code == 0, listed.stderr
    assert [t["task_id"] for t in listed.json()["tasks"]] == [kept]
    assert damaged in listed.stderr and "left out" in listed.stderr, listed.stderr

    assert cli("tasks", "show", kept).code == 0, "the other task reads as before"


def test_a_task_whose_json_column_is_not_json_is_unreadable_not_a_traceback(workdir):
    from support.tasks import new_task

    store = Store(workdir / "bridge.db")
    try:
        store.insert_task(new_task("t1"), {"worker": "mock"})
        damage(workdir / "bridge.db", "tasks", "task_id", "t1", "verification", "{not json")
        with pytest.raises(RecordUnreadable, match="Task t1's stored record cannot be read"):
            store.load_task("t1")
        assert store.list_tasks() == []
    finally:
        store.close()


def test_a_damaged_job_in_another_repository_does_not_break_the_job_listing(workdir):
    store = Store(workdir / "bridge.db")
    try:
        store.jobs.insert(new_job("mine", repository="/mine"), {})
        store.jobs.insert(new_job("theirs", repository="/theirs"), {})
        damage(workdir / "bridge.db", "jobs", "job_id", "theirs", "config", "{cut short")

        assert [job.job_id for job in store.jobs.records()] == ["mine"]
        with pytest.raises(RecordUnreadable, match="Job theirs's stored record"):
            store.jobs.record("theirs")
    finally:
        store.close()


def test_the_circuit_breaker_reads_a_task_with_a_damaged_worker_exit_as_no_exit(workdir):
    from support.tasks import new_task

    store = Store(workdir / "bridge.db")
    try:
        store.insert_task(new_task("t1"), {"worker": "mock"})
        damage(workdir / "bridge.db", "tasks", "task_id", "t1", "worker_exit", '{"code": "x"')
        damage(workdir / "bridge.db", "tasks", "task_id", "t1", "error", "[1, 2]")
        with store.transaction() as conn:
            outcome = task_outcome(conn, "t1")
        assert outcome is not None
        assert outcome.worker_exit is None and outcome.error_kind is None
    finally:
        store.close()
