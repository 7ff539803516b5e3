"""`worker-bridge workspaces prune`: a dry run by default; with --apply it reclaims what finished
tasks left (worktrees, private git dirs, task branches, old artifacts), folders and containers
no task owns, and never anything of a task that is still running or of succeeded work that was
not accepted yet (unless --include-unaccepted)."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest
from support.repos import git
from support.tasks import mock_task, run_spec, show_task, start_spec, wait_for_event
from support.waiting import poll, process_gone
from testcontainers.core.container import DockerContainer

# -- helpers ------------------------------------------------------------------------------------


def runner_pid(home: Path, task_id: str) -> int | None:
    import sqlite3

    conn = sqlite3.connect(str(home / "bridge.db"), timeout=30)
    try:
        row = conn.execute("SELECT runner_pid FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return row[0] if row else None
    finally:
        conn.close()


def prune(cli, *flags: str) -> dict:
    result = cli("workspaces", "prune", *flags, "--json")
    assert result.code == 0, result.stderr
    report = result.json()
    assert report["applied"] is ("--apply" in flags)
    return report


def actions_for(report: dict, task_id: str) -> list[dict]:
    return [a for a in report["actions"] if a["task_id"] == task_id]


def branch_exists(repo: Path, task_id: str) -> bool:
    out = git(repo, "branch", "--list", f"worker-bridge/{task_id}", "--format=%(refname:short)")
    return out.strip() == f"worker-bridge/{task_id}"


def worktrees(repo: Path) -> list[Path]:
    return [
        Path(line.split(" ", 1)[1]).resolve()
        for line in git(repo, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]


def workspace_exists(home: Path, repo: Path, task_id: str) -> bool:
    """All three parts of a task's workspace are there."""
    return (
        (home / "worktrees" / task_id).is_dir()
        and (home / "gitdirs" / task_id).is_dir()
        and branch_exists(repo, task_id)
        and (home / "worktrees" / task_id).resolve() in worktrees(repo)
    )


def workspace_gone(home: Path, repo: Path, task_id: str) -> bool:
    """None of the parts of a task's workspace is left."""
    return (
        not (home / "worktrees" / task_id).exists()
        and not (home / "gitdirs" / task_id).exists()
        and not branch_exists(repo, task_id)
        and (home / "worktrees" / task_id).resolve() not in worktrees(repo)
    )


def containers(**labels: str) -> list:
    client = docker.from_env()
    try:
        wanted = [f"io.worker-bridge.{k}={v}" for k, v in labels.items()]
        return client.containers.list(all=True, filters={"label": wanted})
    finally:
        client.close()


@pytest.fixture(autouse=True)
def _defaults(monkeypatch):
    monkeypatch.delenv("WORKER_BRIDGE_RETENTION_DAYS", raising=False)


# -- tests --------------------------------------------------------------------------------------


def test_a_dry_run_lists_failed_and_cancelled_workspaces_and_apply_removes_them(
    cli, repo, workdir, home, docker_images
):
    failed = run_spec(cli, workdir, mock_task(repo, {"write": {"f.txt": "f"}, "exit_code": 1}))
    assert failed["status"] == "failed", failed["error"]
    failed_id = failed["task_id"]

    cancelled_id = start_spec(cli, workdir, mock_task(repo, {"sleep": 30}))
    wait_for_event(cli, cancelled_id, "worker.started")
    pid = runner_pid(home, cancelled_id)
    assert cli("tasks", "cancel", cancelled_id).code == 0
    poll(lambda: process_gone(pid), "the cancelled task's runner to exit")
    assert show_task(cli, cancelled_id)["status"] == "cancelled"

    for task_id in (failed_id, cancelled_id):
        assert workspace_exists(home, repo, task_id)
    # What a killed runner's gateways leave: their folders, with sockets no one listens on.
    left = [home / "gateways" / failed_id, home / "gateways" / f"{failed_id}-setup"]
    for folder in left:
        folder.mkdir(parents=True)
        (folder / "routes.sock").write_text("")

    dry = prune(cli)
    for task_id in (failed_id, cancelled_id):
        listed = [a for a in actions_for(dry, task_id) if a["kind"] == "workspace"]
        assert len(listed) == 1
        assert Path(listed[0]["target"]) == home / "worktrees" / task_id
        assert workspace_exists(home, repo, task_id), "a dry run removed something"

    applied = prune(cli, "--apply")
    for task_id in (failed_id, cancelled_id):
        assert [a["kind"] for a in actions_for(applied, task_id)] == ["workspace"]
        assert workspace_gone(home, repo, task_id)
    assert not any(folder.exists() for folder in left)
    assert worktrees(repo) == [repo.resolve()]
    assert git(repo, "status", "--porcelain") == ""

    again = prune(cli)
    assert not actions_for(again, failed_id) and not actions_for(again, cancelled_id)


def test_succeeded_work_not_yet_accepted_is_kept_unless_include_unaccepted(
    cli, repo, workdir, home, docker_images
):
    done = run_spec(cli, workdir, mock_task(repo, {"write": {"s.txt": "s"}}, verify=["true"]))
    assert done["status"] == "succeeded", done["error"]
    task_id = done["task_id"]

    kept = prune(cli, "--apply")
    assert not actions_for(kept, task_id)
    assert workspace_exists(home, repo, task_id)

    listed = prune(cli, "--include-unaccepted")
    assert [a["kind"] for a in actions_for(listed, task_id)] == ["workspace"]
    assert workspace_exists(home, repo, task_id)

    removed = prune(cli, "--apply", "--include-unaccepted")
    assert [a["kind"] for a in actions_for(removed, task_id)] == ["workspace"]
    assert workspace_gone(home, repo, task_id)


def test_a_running_task_is_never_touched(cli, repo, workdir, home, docker_images):
    task_id = start_spec(cli, workdir, mock_task(repo, {"sleep": 30}))
    wait_for_event(cli, task_id, "worker.started")
    try:
        for flags in ((), ("--apply",), ("--apply", "--include-unaccepted")):
            report = prune(cli, *flags)
            assert not actions_for(report, task_id), flags
            assert not [a for a in report["actions"] if task_id in a["target"]], flags
        assert workspace_exists(home, repo, task_id)
        running = containers(task=task_id, role="worker")
        assert [c.status for c in running] == ["running"]
        assert show_task(cli, task_id)["status"] == "running"
    finally:
        cli("tasks", "cancel", task_id)
    assert show_task(cli, task_id)["status"] == "cancelled"


def test_orphan_folders_and_containers_are_listed_and_removed(cli, home, docker_images):
    from bridge.sandbox import home_id

    assert cli("tasks", "list").code == 0  # makes the store
    orphans = [home / "worktrees" / "not-a-task", home / "tasks" / "gone-task"]
    for folder in orphans:
        folder.mkdir(parents=True)
        (folder / "leftover.txt").write_text("x")
    # A throwaway container of this state root that belongs to no task, started by testcontainers.
    ghost = DockerContainer(
        docker_images.image_for("base"),
        command="sleep 60",
        labels={"io.worker-bridge.home": home_id(home), "io.worker-bridge.task": "ghost"},
        network_mode="none",
    ).start()
    ghost_id = ghost.get_wrapped_container().id

    dry = prune(cli)
    dirs = {a["target"] for a in dry["actions"] if a["kind"] == "orphan_dir"}
    assert dirs == {str(folder) for folder in orphans}
    found = [a for a in dry["actions"] if a["kind"] == "container"]
    assert [(a["target"], a["task_id"]) for a in found] == [(ghost_id[:12], "ghost")]
    assert all(folder.is_dir() for folder in orphans)
    assert containers(task="ghost", home=home_id(home))

    applied = prune(cli, "--apply")
    assert {a["kind"] for a in applied["actions"]} == {"orphan_dir", "container"}
    assert not any(folder.exists() for folder in orphans)
    poll(lambda: not containers(task="ghost", home=home_id(home)), "the orphan container to go", 30)
    assert prune(cli)["actions"] == []


def test_artifacts_are_removed_only_past_the_retention_period(
    cli, repo, workdir, home, docker_images
):
    failed = run_spec(cli, workdir, mock_task(repo, {"write": {"a.txt": "a"}, "exit_code": 3}))
    assert failed["status"] == "failed", failed["error"]
    task_id = failed["task_id"]
    task_dir = home / "tasks" / task_id
    assert set(failed["artifacts"]) == {"diff", "manifest", "readable"}
    assert task_dir.is_dir()

    default = prune(cli, "--apply")  # retention_days defaults to 14
    assert [a["kind"] for a in actions_for(default, task_id)] == ["workspace"]
    assert task_dir.is_dir()
    assert set(show_task(cli, task_id)["artifacts"]) == {"diff", "manifest", "readable"}

    (home / "config.yaml").write_text("retention_days: 0\n")
    applied = prune(cli, "--apply")
    reclaimed = actions_for(applied, task_id)
    assert [(a["kind"], Path(a["target"])) for a in reclaimed] == [("artifacts", task_dir)]
    assert not task_dir.exists()
    assert show_task(cli, task_id)["artifacts"] == {}


def test_prune_after_accept_removes_the_task_branch_and_leaves_the_working_tree(
    cli, repo, workdir, home, docker_images
):
    done = run_spec(
        cli, workdir, mock_task(repo, {"write": {"new.txt": "from the worker\n"}}, verify=["true"])
    )
    assert done["status"] == "succeeded", done["error"]
    task_id = done["task_id"]
    (repo / "README.md").write_text("# demo\nmy own edit\n")
    (repo / "notes.txt").write_text("mine, untracked\n")
    accepted = cli("tasks", "accept", task_id)
    assert accepted.code == 0, accepted.stderr
    assert branch_exists(repo, task_id)
    status_before = git(repo, "status", "--porcelain")
    files_before = {
        name: (repo / name).read_text() for name in ("README.md", "notes.txt", "new.txt")
    }

    applied = prune(cli, "--apply")
    assert [a["kind"] for a in actions_for(applied, task_id)] == ["workspace"]
    assert not branch_exists(repo, task_id)
    assert workspace_gone(home, repo, task_id)
    assert git(repo, "status", "--porcelain") == status_before
    assert {name: (repo / name).read_text() for name in files_before} == files_before
    assert files_before["new.txt"] == "from the worker\n"
    assert show_task(cli, task_id)["status"] == "accepted"


def test_an_orphan_worktree_git_still_knows_is_unregistered_with_its_branch(cli, repo, home):
    (home / "worktrees").mkdir()
    ghost = home / "worktrees" / "ghost"
    git(repo, "worktree", "add", "-q", "-b", "worker-bridge/ghost", str(ghost), "HEAD")
    (home / "logs").mkdir()
    (home / "logs" / "runner-ghost.log").write_text("old log\n")

    report = prune(cli)
    kinds = {(a["kind"], Path(a["target"]).name) for a in report["actions"]}
    assert ("orphan_dir", "ghost") in kinds and ("orphan_log", "runner-ghost.log") in kinds

    prune(cli, "--apply")
    assert not ghost.exists()
    assert str(ghost) not in git(repo, "worktree", "list", "--porcelain")
    assert git(repo, "branch", "--list", "worker-bridge/ghost") == ""
    assert not (home / "logs" / "runner-ghost.log").exists()
