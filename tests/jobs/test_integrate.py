"""Fanout and integrate through the real engine: several objectives on one base, one task each;
then the chosen verified tasks applied one after another onto the common base, verified after
each, stopping at the first conflict with a report that names the task and the path; the last
verified step accepted like any task; the user's repository untouched until then; and bad input
(a task twice, a task of another job, tasks on different bases) refused in one sentence."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.jobs import wait_job
from support.repos import commit_files, git

from bridge import WorkerBridge
from bridge.errors import InvalidSpec, TaskNotFound, TaskStateError


def _fanout(bridge: WorkerBridge, repo: Path, writes: list[dict], verify: list[str]):
    spec = {
        "objective": "unused",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": verify},
        "metadata": {"candidates": [{"mock": {"write": w}} for w in writes]},
    }
    objectives = [f"part {n + 1}" for n in range(len(writes))]
    done = wait_job(bridge, bridge.fanout(spec, objectives).job_id)
    assert done.status == "succeeded", done.error
    return done


def test_integrate_applies_two_compatible_changes_and_stops_at_a_conflicting_third(
    bridge: WorkerBridge, repo: Path, docker_images
):
    verify = ["python3 -c 'import calc'", "test -f README.md"]
    fan = _fanout(
        bridge,
        repo,
        [{"a.txt": "from one\n"}, {"b.txt": "from two\n"}, {"a.txt": "three\n"}],
        verify,
    )
    assert [t.role for t in fan.tasks] == ["part"] * 3
    ids = [t.task_id for t in fan.tasks]
    head, refs = git(repo, "rev-parse", "HEAD"), git(repo, "for-each-ref")

    done = wait_job(bridge, bridge.integrate(fan.job_id, ids).job_id)
    assert done.status == "failed"
    steps = done.rounds
    assert [s.get("status") for s in steps] == ["succeeded", "succeeded", None]
    assert steps[2]["conflict"] == ["a.txt"]
    assert f"Task {ids[2]} conflicts with the changes before it on a.txt" in done.error.message
    assert "(2 of 3 applied and verified.)" in done.error.message
    assert all(s.get("verification_ok") is True for s in steps[:2]), "verified after each"
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == ""
    added = set(git(repo, "for-each-ref").splitlines()) - set(refs.splitlines())
    steps_ids = {s["integration_task"] for s in steps[:2]}
    assert {line.rsplit("/", 1)[1] for line in added} == steps_ids, "only the steps' task branches"

    integration = bridge.get_task(done.winner)
    assert sorted(f.path for f in integration.changed_files) == ["a.txt", "b.txt"]
    outcome = bridge.accept_job(done.job_id)
    assert outcome.accepted, outcome.reason
    assert (repo / "a.txt").read_text() == "from one\n"
    assert (repo / "b.txt").read_text() == "from two\n"

    scratch = bridge.config.home / "jobs" / done.job_id
    assert scratch.is_dir(), "the merges' objects were kept apart from the repository's"
    planned = bridge.prune_workspaces()["actions"]
    assert {"kind": "job_scratch", "target": str(scratch)} in [
        {"kind": a["kind"], "target": a["target"]} for a in planned
    ]
    bridge.prune_workspaces(apply=True)
    assert not scratch.exists()


def test_integrate_refuses_bad_input_with_one_sentence(bridge, repo, docker_images):
    fan = _fanout(bridge, repo, [{"a.txt": "1\n"}, {"b.txt": "2\n"}], ["true"])
    ids = [t.task_id for t in fan.tasks]
    with pytest.raises(InvalidSpec, match="names a task twice"):
        bridge.integrate(fan.job_id, [ids[0], ids[0]])
    commit_files(repo, {"c.txt": "moved on\n"}, "move HEAD")
    other = _fanout(bridge, repo, [{"d.txt": "1\n"}, {"e.txt": "2\n"}], ["true"])
    with pytest.raises(TaskNotFound, match="is not a task of job"):
        bridge.integrate(fan.job_id, [ids[0], other.tasks[0].task_id])
    bridge.store.update_task(other.tasks[0].task_id, job_id=fan.job_id)  # as if of one job
    with pytest.raises(InvalidSpec, match="different base commits"):
        bridge.integrate(fan.job_id, [ids[0], other.tasks[0].task_id])
    with pytest.raises(InvalidSpec, match="at least two objectives"):
        bridge.fanout({"objective": "x", "workspace": {"repository": str(repo)}}, ["only one"])


def _tree(repo: Path, commit: str) -> list[str]:
    """Every entry of COMMIT's tree, mode, object and path (so content and mode alike)."""
    return git(repo, "ls-tree", "-r", "--full-tree", commit).splitlines()


def test_the_integration_is_the_merge_of_the_chosen_snapshots_mode_for_mode_and_byte_for_byte(
    bridge: WorkerBridge, repo: Path, docker_images
):
    # One part adds an executable script and makes the base's calc.py executable; another
    # edits the README. An integration that dropped either bit would differ from the merge.
    specs = [
        {"write": {"run.sh": "#!/bin/sh\necho hi\n"}, "script": "chmod 0755 run.sh calc.py"},
        {"write": {"README.md": "# demo, edited\n"}},
    ]
    spec = {
        "objective": "unused",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": ["true"]},
        "metadata": {"candidates": [{"mock": m} for m in specs]},
    }
    fan = wait_job(bridge, bridge.fanout(spec, ["part 1", "part 2"]).job_id)
    assert fan.status == "succeeded", fan.error
    ids = [t.task_id for t in fan.tasks]
    snapshots = [bridge._task(t).snapshot_commit for t in ids]
    assert "100755" in git(repo, "ls-tree", snapshots[0], "run.sh"), "the part kept its bit"

    done = wait_job(bridge, bridge.integrate(fan.job_id, ids).job_id)
    assert done.status == "succeeded", done.error
    merged = git(repo, "merge-tree", "--write-tree", *snapshots).split()[0]
    integration = bridge._task(done.winner).snapshot_commit
    assert _tree(repo, integration) == _tree(repo, merged)


def test_an_integration_bigger_than_its_bound_stops_in_one_sentence_before_any_step_is_made(
    home: Path, repo: Path, docker_images
):
    # The merged files ride in each step's task spec (kept in the store): step k would carry
    # every byte of the first k tasks, so what one step carries is bounded.
    bridge = WorkerBridge(home=home, jobs={"integration_kb": 16})
    try:
        big = "".join(f"line {n:06d} of a large generated file\n" for n in range(1000))
        fan = _fanout(bridge, repo, [{"big.txt": big}, {"b.txt": "2\n"}], ["true"])
        ids = [t.task_id for t in fan.tasks]
        done = wait_job(bridge, bridge.integrate(fan.job_id, ids).job_id)
        assert done.status == "failed"
        assert done.error.message.startswith(
            f"The change up to task {ids[0]} holds more than 16 KB of file contents and paths"
        )
        assert [t.role for t in done.tasks] == [], "no step task was made"
    finally:
        bridge.close()


def test_a_conflict_on_many_files_is_reported_within_bounds(
    bridge: WorkerBridge, repo: Path, docker_images
):
    first = {f"f{n:03d}.txt": "one\n" for n in range(130)}
    second = {f"f{n:03d}.txt": "two\n" for n in range(130)}
    fan = _fanout(bridge, repo, [first, second], ["true"])
    done = wait_job(bridge, bridge.integrate(fan.job_id, [t.task_id for t in fan.tasks]).job_id)
    assert done.status == "failed"
    assert "f019.txt and 110 more." in done.error.message
    assert "f020.txt" not in done.error.message
    assert len(done.rounds[1]["conflict"]) == 100


def test_many_empty_files_count_against_the_integration_bound_too(
    home: Path, repo: Path, docker_images
):
    bridge = WorkerBridge(home=home, jobs={"integration_kb": 16})
    try:
        empty = {f"empty/f{n:03d}.txt": "" for n in range(300)}
        fan = _fanout(bridge, repo, [empty, {"b.txt": "2\n"}], ["true"])
        done = wait_job(bridge, bridge.integrate(fan.job_id, [t.task_id for t in fan.tasks]).job_id)
        assert done.status == "failed"
        assert "holds more than 16 KB of file contents and paths" in done.error.message
    finally:
        bridge.close()


def test_an_integration_whose_part_was_accepted_alone_is_not_accepted_on_top_of_it(
    bridge: WorkerBridge, repo: Path, docker_images
):
    fan = _fanout(bridge, repo, [{"a.txt": "from one\n"}, {"b.txt": "from two\n"}], ["true"])
    ids = [t.task_id for t in fan.tasks]
    done = wait_job(bridge, bridge.integrate(fan.job_id, ids).job_id)
    assert done.status == "succeeded", done.error
    assert bridge.accept_task(ids[0]).accepted, "one part accepted alone with tasks accept"
    with pytest.raises(TaskStateError, match=f"Task {ids[0]}, integrated by job"):
        bridge.accept_job(done.job_id)
    assert not (repo / "b.txt").exists(), "the integration wrote nothing on top"
