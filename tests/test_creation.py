"""Task creation and what a later verb checks again: a start, a follow-up or an accept asks what
the owner's configuration decides (the worker, its metadata, the images the task names), and
reads the task's images again only when the image patterns changed since the task was made.
Creation needs no engine here; the tasks are made, not run."""

from __future__ import annotations

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


def test_a_start_under_the_same_image_patterns_does_not_read_the_task_s_images_again(
    made, monkeypatch
):
    bridge, record = made
    import bridge.environments.task as environment

    def read_again(*args: object) -> None:
        raise AssertionError("creation checked these images against the same patterns")

    monkeypatch.setattr(environment, "check_images", read_again)
    recheck_permissions(bridge.config, bridge.sandbox, record, worker_turn=True)


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
