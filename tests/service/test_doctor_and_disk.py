"""`doctor` says whether tasks can run here, and a task refuses to allocate below the disk
reserve, with a reason and nothing left behind."""

from __future__ import annotations

from support.repos import git
from support.tasks import task_flags


def test_doctor_passes_when_the_engine_and_images_are_there(cli, docker_images):
    result = cli("doctor", "--json")
    assert result.code == 0, result.stdout + result.stderr
    checks = {c["check"]: c for c in result.json()["checks"]}
    assert checks["engine"]["ok"] and checks["store"]["ok"]
    assert checks["image:mock"]["ok"] and checks["image:verify"]["ok"]


def test_doctor_fails_with_one_actionable_line_when_the_engine_is_unreachable(cli):
    result = cli("doctor", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert result.code == 1
    engine_lines = [line for line in result.stdout.splitlines() if " engine " in line]
    assert len(engine_lines) == 1 and "dockerd" in engine_lines[0]


def test_doctor_names_the_build_command_for_a_missing_image(cli, docker_images):
    result = cli("doctor", env={"WORKER_BRIDGE_IMAGE_TAG": "not-built"})
    assert result.code == 1
    assert "worker-bridge images build mock" in result.stdout


def test_a_task_below_the_disk_reserve_fails_before_allocating(cli, repo, home, docker_images):
    (home / "config.yaml").write_text("disk_reserve_gb: 1000000\n")
    flags = task_flags(repo, "x", metadata={"mock": {"write": {"a": "a"}}})
    run = cli("tasks", "run", *flags, "--json")
    assert run.code == 1
    result = run.json()
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "disk"  # a full disk is not a sandbox failure
    assert "reserve" in result["error"]["message"] and "prune" in result["error"]["message"]
    assert not (home / "worktrees").exists() or not any((home / "worktrees").iterdir())
    assert git(repo, "branch", "--list", "worker-bridge/*") == ""


def test_doctor_writes_nothing_into_the_store(cli, home, docker_images):
    assert cli("doctor", "--json").code == 0
    assert not (home / "bridge.db").exists(), "no store is made for a check"
    from bridge.store import Store

    store = Store(home / "bridge.db")
    before = store.query("SELECT COUNT(*) AS n FROM events")[0]["n"]
    store.close()
    result = cli("doctor", "--json")
    assert result.code == 0 and result.json()["checks"], result.stderr
    store = Store(home / "bridge.db")
    try:
        assert store.query("SELECT COUNT(*) AS n FROM events")[0]["n"] == before
    finally:
        store.close()
    (home / "bridge.db").chmod(0o444)
    import os

    if os.geteuid() != 0:  # root writes anyway
        assert cli("doctor", "--json").json()["ok"] is False
