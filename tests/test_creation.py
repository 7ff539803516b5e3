"""Task creation and what a later verb checks again: a start, a follow-up or an accept asks what
the owner's configuration decides (the worker, its metadata, the images the task names), every
time, against the configuration now. Creation needs no engine here; the tasks are made, not
run."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from support.tasks import bare_spec

from bridge import WorkerBridge
from bridge.errors import InvalidSpec
from bridge.pipeline.creation import recheck_permissions
from bridge.sandbox.fake import FakeSandbox

ALLOWED = "wb-ci-runner:1"


@pytest.fixture
def made(home: Path, repo: Path):
    """A task whose verification image the owner allowed, and the bridge that made it."""
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox(), allowed_images=["wb-ci-runner:*"])
    spec = bare_spec(repo, verification={"commands": ["true"], "image": ALLOWED})
    task = bridge.create_task(spec)
    yield bridge, bridge.store.load_task(task.task_id)
    bridge.close()


def test_a_row_recorded_without_image_patterns_is_checked_against_todays(made, home):
    """A row from a version that recorded no `allowed_images` reads back with today's default
    (none): the same patterns as a strict owner's now, yet never checked against them. A start
    checks its images all the same, and refuses one the owner does not allow."""
    bridge, record = made
    with sqlite3.connect(bridge.config.store_path) as conn:
        (raw,) = conn.execute("SELECT config FROM tasks WHERE task_id = ?", (record.task_id,))
        recorded = json.loads(raw[0])
        del recorded["allowed_images"]
        conn.execute(
            "UPDATE tasks SET config = ? WHERE task_id = ?",
            (json.dumps(recorded), record.task_id),
        )
    old = bridge.store.load_task(record.task_id)
    strict = bridge.config.model_copy(update={"allowed_images": []})
    assert old.config.allowed_images == strict.allowed_images == []
    with pytest.raises(InvalidSpec, match=f"verification.image '{ALLOWED}'.*allowed_images"):
        recheck_permissions(strict, bridge.sandbox, old, worker_turn=True)


def test_a_spec_model_changed_after_it_was_made_is_validated_again_and_nothing_written(home, repo):
    """A library caller's TaskSpec is a mutable model: a value set on it afterwards is checked
    like any other, and a refused one writes no task."""
    from bridge.models import TaskSpec

    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    try:
        spec = TaskSpec.model_validate(bare_spec(repo))
        spec.priority = 1000
        with pytest.raises(InvalidSpec, match="priority"):
            bridge.create_task(spec)
        assert bridge.list_tasks() == []
    finally:
        bridge.close()


def test_a_start_after_the_owner_narrowed_the_images_reads_them_again_and_is_refused(made):
    bridge, record = made
    narrowed = bridge.config.model_copy(update={"allowed_images": []})
    with pytest.raises(InvalidSpec, match=f"verification.image '{ALLOWED}'.*allowed_images"):
        recheck_permissions(narrowed, bridge.sandbox, record, worker_turn=False)
    widened = bridge.config.model_copy(update={"allowed_images": ["wb-*"]})
    recheck_permissions(widened, bridge.sandbox, record, worker_turn=True)  # still allowed


def test_a_task_is_recorded_with_the_spec_as_validated_and_the_repository_s_top_level(home, repo):
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    try:
        inside = repo / "sub"
        inside.mkdir()
        made = bridge.create_task(bare_spec(inside, priority=70))
        record = bridge.store.load_task(made.task_id)
        assert record.repository == str(repo.resolve()), "the work tree's top level"
        assert record.spec.workspace.repository == str(inside), "the spec as given"
        assert record.priority == record.spec.priority == 70, "its column and its spec"
    finally:
        bridge.close()
