"""Cancel, deadlines, memory limits and crash recovery of detached runners.

A runner is killed deterministically at a phase (tests/support/paused_runner.py runs the task with
an injected hook that emits `test.paused` with its pid and sleeps at the start of that phase) or
right after an event it emitted; the next `worker-bridge` command must hand the task to a new runner
that finishes it. Only pids read from the store are ever signalled.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from support.engine import task_containers
from support.repos import git
from support.tasks import (
    TERMINAL,
    mock_task,
    show_task,
    task_events,
    wait_for_event,
    wait_until_done,
    write_spec,
)
from support.waiting import poll, process_gone

PAUSED_RUNNER = Path(__file__).parents[1] / "support" / "paused_runner.py"


# -- helpers ------------------------------------------------------------------------------------


def create(cli, workdir: Path, spec: dict) -> str:
    path = write_spec(workdir / f"spec-{uuid.uuid4().hex[:8]}.json", spec)
    created = cli("tasks", "create", "--spec", str(path))
    assert created.code == 0, created.stderr
    return created.stdout.strip()


def start_detached(cli, task_id: str, pause: str | None = None, home: Path | None = None) -> None:
    """`tasks start`, or with ``pause`` a runner that stops at that phase to be killed."""
    if pause is None:
        started = cli("tasks", "start", task_id)
        assert started.code == 0, started.stderr
        return
    assert home is not None
    log = open(home / f"paused-{task_id}.log", "ab")  # noqa: SIM115 (the runner keeps it)
    subprocess.Popen(
        [sys.executable, str(PAUSED_RUNNER), str(home / "bridge.db"), task_id, pause],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    log.close()


def _db(home: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(home / "bridge.db"), timeout=30)
    conn.row_factory = sqlite3.Row
    return conn


def _rows(home: Path, sql: str, *params: object) -> list[dict]:
    """Rows read straight from the store: no bridge code runs, so nothing is recovered."""
    conn = _db(home)
    try:
        return [dict(row) for row in conn.execute(sql, params).fetchall()]
    finally:
        conn.close()


def runner_row(home: Path, task_id: str) -> dict:
    """The task's runner claim."""
    columns = "status, phase, runner_id, runner_pid, runner_expires_at"
    [row] = _rows(home, f"SELECT {columns} FROM tasks WHERE task_id = ?", task_id)
    return row


def store_events(home: Path, task_id: str) -> list[dict]:
    """Events read from the store: unlike a CLI command, this recovers nothing."""
    sql = "SELECT event_id, kind, at, data FROM events WHERE task_id = ? ORDER BY event_id"
    return [{**row, "data": json.loads(row["data"] or "{}")} for row in _rows(home, sql, task_id)]


def lease_rows(home: Path, task_id: str) -> list[dict]:
    return _rows(home, "SELECT scope, owner, expires_at FROM leases WHERE task_id = ?", task_id)


def kinds(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["kind"] == kind]


def kill_runner(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    poll(lambda: process_gone(pid), f"runner {pid} to die after SIGKILL", 20)


def wait_no_containers(task_id: str) -> None:
    poll(lambda: not task_containers(task_id), f"the containers of task {task_id} to go", 30)


def iso(at: str) -> float:
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def cli_prefix() -> list[str]:
    script = Path(sys.executable).parent / "worker-bridge"
    return [str(script)] if script.exists() else [sys.executable, "-m", "bridge.cli"]


@pytest.fixture(autouse=True)
def _clean_env_and_runners(monkeypatch, home: Path):
    """No concurrency override leaks in from outside; at the end, any runner
    process of this test's store that is still alive (a paused one after a failure) is killed,
    by the pid the store recorded and only when it is that task's runner."""
    monkeypatch.delenv("WORKER_BRIDGE_MAX_CONCURRENCY", raising=False)
    yield
    if not (home / "bridge.db").exists():
        return
    conn = _db(home)
    try:
        rows = conn.execute(
            "SELECT task_id, runner_pid FROM tasks WHERE runner_pid IS NOT NULL"
        ).fetchall()
    finally:
        conn.close()
    for task_id, pid in rows:
        try:
            cmdline = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if ("bridge.pipeline" in cmdline or str(PAUSED_RUNNER) in cmdline) and task_id in cmdline:
            os.kill(pid, signal.SIGKILL)


def limit_concurrency_to_one(home: Path) -> None:
    (home / "config.yaml").write_text("max_concurrency: 1\n")


# -- cancel -------------------------------------------------------------------------------------


def test_cancelling_a_detached_run_is_final_and_its_container_goes(
    cli, repo, workdir, home, docker_images
):
    task_id = create(cli, workdir, mock_task(repo, {"sleep": 30, "write": {"x.txt": "x"}}))
    start_detached(cli, task_id)
    wait_for_event(cli, task_id, "worker.started")
    pid = runner_row(home, task_id)["runner_pid"]
    assert pid, "the runner recorded no pid"
    assert task_containers(task_id, role="worker"), "the worker container is not there"

    cancelled = cli("tasks", "cancel", task_id)
    assert cancelled.code == 0, cancelled.stderr
    assert show_task(cli, task_id)["status"] == "cancelled"
    wait_no_containers(task_id)

    poll(lambda: process_gone(pid), "the cancelled task's runner to exit", 60)
    result = show_task(cli, task_id)
    assert result["status"] == "cancelled"
    assert result["error"]["kind"] == "cancelled"
    statuses = [e["data"]["to"] for e in kinds(task_events(cli, task_id), "task.status")]
    assert statuses[-1] == "cancelled" and statuses.count("cancelled") == 1
    assert not task_containers(task_id)


def test_cancelling_a_wait_run_from_another_process_ends_it_with_exit_1(
    cli, repo, workdir, home, docker_images
):
    task_id = create(cli, workdir, mock_task(repo, {"sleep": 30}))
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    proc = subprocess.Popen(
        [*cli_prefix(), "tasks", "start", task_id, "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_for_event(cli, task_id, "worker.started")
        cancelled = cli("tasks", "cancel", task_id)
        assert cancelled.code == 0, cancelled.stderr
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    assert f"task {task_id} cancelled" in err
    result = show_task(cli, task_id)
    assert result["status"] == "cancelled"
    assert result["error"]["kind"] == "cancelled"
    wait_no_containers(task_id)


def test_ctrl_c_of_tasks_run_cancels_the_task_and_leaves_nothing_mounted_or_running(
    cli, repo, workdir, home, docker_images
):
    from bridge.workspace import overlay

    spec = write_spec(workdir / "spec.json", mock_task(repo, {"sleep": 120}, verify=["true"]))
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    proc = subprocess.Popen(
        [*cli_prefix(), "tasks", "run", "--spec", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    root = Path(overlay.real(home))  # as mountinfo names it
    try:
        # While the worker sleeps, verification's checkout is prepared: mounted (layered).
        [point] = poll(
            lambda: overlay.mount_points(root / "mounts") - {str(root / "mounts")},
            "the verification checkout to be mounted",
            120,
        )
        task_id = Path(point).name.partition(overlay.MOUNT_SEP)[0]
        poll(lambda: task_containers(task_id, role="worker"), "the worker container", 60)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    assert f"task {task_id} cancelled" in err
    # Read before any command that acts (its recovery would undo what was left): the only
    # mount under the state root is the task's worktree, kept like any ended task's until prune.
    assert overlay.mount_points(root) == {str(root / "worktrees" / task_id)}
    assert not task_containers(task_id)
    assert show_task(cli, task_id)["status"] == "cancelled"


def test_cancelling_during_verification_removes_the_verify_container(
    cli, repo, workdir, home, docker_images
):
    task_id = create(cli, workdir, mock_task(repo, {"write": {"v.txt": "v"}}, verify=["sleep 30"]))
    start_detached(cli, task_id)
    wait_for_event(cli, task_id, "verification.started")
    poll(lambda: task_containers(task_id, role="verify"), "the verify container to start", 30)
    pid = runner_row(home, task_id)["runner_pid"]

    cancelled = cli("tasks", "cancel", task_id)
    assert cancelled.code == 0, cancelled.stderr
    wait_no_containers(task_id)
    poll(lambda: process_gone(pid), "the cancelled task's runner to exit", 60)
    result = show_task(cli, task_id)
    assert result["status"] == "cancelled"
    assert result["error"]["kind"] == "cancelled"


def test_cancelling_a_finished_task_is_refused_and_leaves_it_as_it_was(
    cli, repo, workdir, docker_images
):
    spec = write_spec(workdir / "t.json", mock_task(repo, {"write": {"f.txt": "f"}}))
    run = cli("tasks", "run", "--spec", str(spec), "--json")
    assert run.code == 0, run.stderr
    task_id = run.json()["task_id"]
    before = show_task(cli, task_id)
    assert before["status"] == "succeeded"

    refused = cli("tasks", "cancel", task_id)
    assert refused.code == 1
    assert "already ended succeeded" in refused.stderr
    after = show_task(cli, task_id)
    assert after["status"] == "succeeded"
    assert after["error"] is None
    assert after["finished_at"] == before["finished_at"]


# -- deadlines and memory -----------------------------------------------------------------------


def test_the_deadline_passing_while_the_worker_runs_times_the_task_out(
    cli, repo, workdir, docker_images
):
    spec = write_spec(workdir / "t.json", mock_task(repo, {"sleep": 60}))
    run = cli("tasks", "run", "--spec", str(spec), "--timeout", "2", "--json")
    assert run.code == 1, run.stderr
    result = run.json()
    assert result["status"] == "timed_out"
    assert result["error"]["kind"] == "timeout"
    assert "worker" in result["error"]["message"]
    assert "2 s" in result["error"]["message"]
    wait_no_containers(result["task_id"])


def test_the_deadline_passing_during_verification_times_the_task_out(
    cli, repo, workdir, docker_images
):
    spec = write_spec(
        workdir / "t.json", mock_task(repo, {"write": {"v.txt": "v"}}, verify=["sleep 60"])
    )
    run = cli("tasks", "run", "--spec", str(spec), "--timeout", "3", "--json")
    assert run.code == 1, run.stderr
    result = run.json()
    assert result["status"] == "timed_out", result["error"]
    assert result["error"]["kind"] == "timeout"
    assert "verification" in result["error"]["message"]
    assert result["verification"]["ok"] is False
    wait_no_containers(result["task_id"])


def test_a_worker_over_its_memory_limit_fails_with_out_of_memory(cli, repo, workdir, docker_images):
    spec = mock_task(
        repo, {"script": 'python3 -c "x = bytearray(400*1024*1024)"'}, limits={"memory_mb": 64}
    )
    run = cli("tasks", "run", "--spec", str(write_spec(workdir / "t.json", spec)), "--json")
    assert run.code == 1, run.stderr
    result = run.json()
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "out_of_memory", result["error"]
    message = result["error"]["message"]
    assert "64 MB" in message
    completed = kinds(task_events(cli, result["task_id"]), "worker.completed")
    assert completed and completed[-1]["data"]["oom_killed"] is True
    assert f"exit status {completed[-1]['data']['exit_code']}" in message
    wait_no_containers(result["task_id"])


# -- crash recovery -----------------------------------------------------------------------------


def assert_workspace_is_only_the_tasks(repo: Path, home: Path, task_id: str) -> None:
    listed = [
        Path(line.split(" ", 1)[1]).resolve()
        for line in git(repo, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]
    assert listed == [repo.resolve(), (home / "worktrees" / task_id).resolve()]
    assert sorted(os.listdir(home / "worktrees")) == [task_id]
    assert sorted(os.listdir(home / "gitdirs")) == [task_id]
    branches = git(repo, "branch", "--list", "worker-bridge/*", "--format=%(refname:short)")
    assert branches.split() == [f"worker-bridge/{task_id}"]


@pytest.mark.parametrize(
    "phase, kill_at, mock_sleep",
    [
        ("allocating", "pause", 0),
        ("worker", "pause", 0),
        ("worker", "worker.started", 3),
        ("collecting", "pause", 0),
        ("verifying", "pause", 0),
    ],
    ids=[
        "allocating",
        "worker-before-the-container-starts",
        "worker-while-the-container-runs",
        "collecting",
        "verifying",
    ],
)
def test_a_runner_killed_in_any_phase_is_resumed_by_the_next_command_that_acts_and_succeeds(
    cli, repo, workdir, home, docker_images, phase, kill_at, mock_sleep
):
    mock = {"write": {"out.txt": "done\n"}}
    if mock_sleep:
        mock["sleep"] = mock_sleep
    task_id = create(cli, workdir, mock_task(repo, mock, verify=["test -f out.txt"]))
    if kill_at == "pause":
        start_detached(cli, task_id, pause=phase, home=home)
        paused = wait_for_event(cli, task_id, "test.paused")
        assert paused["data"]["phase"] == phase
        pid = paused["data"]["pid"]
    else:
        start_detached(cli, task_id)
        wait_for_event(cli, task_id, kill_at)
        pid = runner_row(home, task_id)["runner_pid"]
    claim = runner_row(home, task_id)
    assert claim["runner_pid"] == pid
    assert claim["phase"] == phase
    kill_runner(pid)
    assert runner_row(home, task_id)["status"] in {"running", "verifying"}
    if phase == "allocating":  # as if it died half way through making the workspace
        worktree = home / "worktrees" / task_id
        git(repo, "worktree", "add", "-q", "-b", f"worker-bridge/{task_id}", str(worktree))
        (worktree / "half.txt").write_text("left by the dead runner\n")
        (home / "gitdirs" / task_id).mkdir(parents=True)
        (home / "gitdirs" / task_id / "partial").write_text("x")

    # Reads start nothing: the task stays stranded through them.
    for read in (["show", task_id], ["list"], ["logs", task_id]):
        assert cli("tasks", *read).code == 0
    assert runner_row(home, task_id)["runner_pid"] == pid, "no read handed it to a runner"
    assert not kinds(task_events(cli, task_id), "task.recovering")

    listed = cli("tasks", "recover", "--json")  # a command that acts recovers the stranded task
    assert listed.code == 0, listed.stderr
    assert listed.json() == {"recovered": [task_id]}
    result = wait_until_done(cli, task_id)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    assert [c["path"] for c in result["changed_files"]] == ["out.txt"]

    events = task_events(cli, task_id)
    assert [e["data"]["phase"] for e in kinds(events, "task.resumed")] == [phase]
    assert len(kinds(events, "worker.started")) == 1
    if kill_at == "worker.started":
        assert len(kinds(events, "worker.adopted")) == 1
    else:
        assert not kinds(events, "worker.adopted")
    wait_no_containers(task_id)
    assert_workspace_is_only_the_tasks(repo, home, task_id)


def test_a_queued_task_whose_runner_died_waiting_for_capacity_is_picked_up_again(
    cli, repo, workdir, home, docker_images
):
    limit_concurrency_to_one(home)
    long_id = create(cli, workdir, mock_task(repo, {"sleep": 30}, objective="holds the slot"))
    queued_id = create(
        cli, workdir, mock_task(repo, {"write": {"q.txt": "q"}}, verify=["test -f q.txt"])
    )
    start_detached(cli, long_id)
    wait_for_event(cli, long_id, "worker.started")
    start_detached(cli, queued_id)
    first = poll(
        lambda: (row := runner_row(home, queued_id))["runner_pid"] and row,
        "the queued task's runner to claim it",
    )
    kill_runner(first["runner_pid"])
    assert runner_row(home, queued_id)["status"] == "queued"  # it died still waiting

    listed = cli("tasks", "recover")
    assert listed.code == 0, listed.stderr
    assert kinds(task_events(cli, queued_id), "task.recovering")
    second = poll(
        lambda: (
            (row := runner_row(home, queued_id))["runner_pid"]
            and row["runner_id"] != first["runner_id"]
            and row
        ),
        "a new runner to claim the queued task",
    )
    assert second["status"] == "queued"  # the slot is still held by the long task

    assert cli("tasks", "cancel", long_id).code == 0
    result = wait_until_done(cli, queued_id)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    wait_no_containers(queued_id)
    wait_no_containers(long_id)


def test_the_lease_of_a_killed_runner_is_free_at_once_and_both_tasks_finish(
    cli, repo, workdir, home, docker_images
):
    limit_concurrency_to_one(home)
    a_id = create(
        cli, workdir, mock_task(repo, {"write": {"a.txt": "a"}}, verify=["test -f a.txt"])
    )
    b_id = create(
        cli, workdir, mock_task(repo, {"write": {"b.txt": "b"}}, verify=["test -f b.txt"])
    )
    start_detached(cli, a_id, pause="worker", home=home)
    pid = wait_for_event(cli, a_id, "test.paused")["data"]["pid"]
    start_detached(cli, b_id)
    poll(lambda: runner_row(home, b_id)["runner_pid"], "B's runner to claim B")
    assert runner_row(home, b_id)["status"] == "queued"  # waiting: A holds the only slot
    held = lease_rows(home, a_id)
    assert held and {lease["owner"] for lease in held} == {runner_row(home, a_id)["runner_id"]}
    ttl_end = min(lease["expires_at"] for lease in held)

    kill_runner(pid)
    # Watch B through the store only: any CLI command here would itself recover A.
    poll(
        lambda: kinds(store_events(home, b_id), "worker.started"),
        "B to start once A's runner is dead",
    )
    b_running = next(
        e for e in kinds(store_events(home, b_id), "task.status") if e["data"]["to"] == "running"
    )
    assert iso(b_running["at"]) < ttl_end, "B waited for the dead runner's lease to expire"
    a_resumed = kinds(store_events(home, a_id), "task.resumed")
    assert all(e["event_id"] > b_running["event_id"] for e in a_resumed)

    listed = cli("tasks", "recover")  # recovers A
    assert listed.code == 0, listed.stderr
    for task_id in (a_id, b_id):
        result = wait_until_done(cli, task_id)
        assert result["status"] == "succeeded", (task_id, result["error"])
        assert result["verification"]["ok"] is True
        wait_no_containers(task_id)
    assert [e["data"]["phase"] for e in kinds(task_events(cli, a_id), "task.resumed")] == ["worker"]


def test_a_killed_runners_still_running_container_keeps_its_slot(
    cli, repo, workdir, home, docker_images
):
    """MAX_CONCURRENCY counts worker containers running at once: the container of a dead
    runner still runs (recovery adopts it), so a waiting task must not start beside it."""
    limit_concurrency_to_one(home)
    a_id = create(cli, workdir, mock_task(repo, {"sleep": 8, "write": {"a.txt": "a"}}))
    b_id = create(cli, workdir, mock_task(repo, {"write": {"b.txt": "b"}}))
    start_detached(cli, a_id)
    wait_for_event(cli, a_id, "worker.started")
    start_detached(cli, b_id)
    poll(lambda: runner_row(home, b_id)["runner_pid"], "B's runner to claim B")
    kill_runner(runner_row(home, a_id)["runner_pid"])
    assert [c.status for c in task_containers(a_id, role="worker")] == ["running"]

    poll(
        lambda: kinds(store_events(home, b_id), "worker.started"),
        "B to start",
    )
    a_running = [c for c in task_containers(a_id, role="worker") if c.status == "running"]
    assert not a_running, "B's worker started while A's worker container was still running"

    assert cli("tasks", "recover").code == 0
    for task_id in (a_id, b_id):
        assert wait_until_done(cli, task_id)["status"] == "succeeded"


def test_runners_killed_at_random_instants_leave_nothing_recovery_and_prune_cannot_finish(
    cli, repo, workdir, home, docker_images
):
    """Kill points are random (seeded, so a failure can be replayed), not one per phase: a
    runner's whole process group is killed, so git may die in the middle of adding a worktree,
    writing a ref or packing a snapshot."""
    import random
    import time

    rng = random.Random(int(os.environ.get("WB_KILL_SEED", "20261201")))
    ids = [
        create(
            cli,
            workdir,
            mock_task(
                repo,
                {"write": {f"f{i}.txt": f"{i}\n"}, "sleep": rng.random()},
                verify=[f"test -f f{i}.txt"],
            ),
        )
        for i in range(8)
    ]
    for task_id in ids:
        start_detached(cli, task_id)
    for task_id in ids:
        row = poll(
            lambda t=task_id: runner_row(home, t)["runner_pid"] and runner_row(home, t),
            f"task {task_id}'s runner to claim it",
        )
        time.sleep(rng.uniform(0, 1.5))
        try:
            os.killpg(row["runner_pid"], signal.SIGKILL)  # the runner and its git processes
        except ProcessLookupError:
            pass  # it already finished

    def all_done():
        assert cli("tasks", "recover").code == 0  # whatever is stranded
        listed = cli("tasks", "list", "--json")
        assert listed.code == 0, listed.stderr
        tasks = {t["task_id"]: t for t in listed.json()["tasks"]}
        return all(tasks[t]["status"] in TERMINAL for t in ids) and tasks

    tasks = poll(all_done, "every task to end after recovery", 240)
    for task_id in ids:
        assert tasks[task_id]["status"] == "succeeded", (task_id, tasks[task_id]["error"])
        wait_no_containers(task_id)

    pruned = cli("workspaces", "prune", "--apply", "--include-unaccepted", "--json")
    assert pruned.code == 0, pruned.stderr
    assert not [a for a in pruned.json()["actions"] if a.get("failed")]
    assert not any((home / "worktrees").iterdir())
    assert not (home / "gitdirs").exists() or not any((home / "gitdirs").iterdir())
    assert git(repo, "branch", "--list", "worker-bridge/*").strip() == ""
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert not list((repo / ".git").rglob("*.lock"))
    assert (
        subprocess.run(
            ["git", "-C", str(repo), "fsck", "--no-dangling"], capture_output=True
        ).returncode
        == 0
    )
    assert cli("workspaces", "prune", "--json").json()["actions"] == []


@pytest.mark.parametrize("module", ["bridge.pipeline", "bridge.jobs"])
def test_a_detached_process_whose_state_root_is_gone_makes_no_new_one(workdir: Path, module: str):
    gone = workdir / "removed-home"
    proc = subprocess.run(
        [sys.executable, "-m", module, "--store", str(gone / "bridge.db"), "abc", "runner-x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "nothing to run" in proc.stderr
    assert not gone.exists(), "no state root is made for a process that has nothing to run"
