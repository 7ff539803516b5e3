"""CLI surfaces not covered elsewhere: create + start (detached and --wait), logs --follow (to
the end, and streaming while the task runs), a spec by process substitution, a confined
caller, list filters, and the usage errors of the parser itself."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading

import pytest
from support.cli import CLI
from support.confine import confined
from support.tasks import mock_task, show_task, task_flags, wait_until_done, write_spec
from support.waiting import poll


def test_create_prints_only_the_task_id_and_the_task_waits_in_created(cli, repo, workdir):
    spec = write_spec(workdir / "t.json", mock_task(repo, {"write": {"x.txt": "x"}}))
    created = cli("tasks", "create", "--spec", str(spec))
    assert created.code == 0, created.stderr
    task_id = created.stdout.strip()
    assert len(created.stdout.splitlines()) == 1
    assert cli("tasks", "show", task_id, "--json").json()["status"] == "created"


def test_flags_beside_a_spec_file_override_its_fields(cli, repo, workdir):
    spec = write_spec(workdir / "t.json", mock_task(repo, {}, objective="from the file"))
    created = cli("tasks", "create", "--spec", str(spec), "--objective", "from the flag", "--json")
    assert created.code == 0, created.stderr
    assert created.json()["objective"] == "from the flag"


def test_start_without_wait_returns_at_once_and_a_detached_runner_finishes_the_task(
    cli, repo, docker_images
):
    mock = {"mock": {"write": {"d.txt": "d"}}}
    flags = task_flags(repo, "detached", verify=("test -f d.txt",), metadata=mock)
    task_id = cli("tasks", "create", *flags).stdout.strip()
    started = cli("tasks", "start", task_id, "--json")
    assert started.code == 0, started.stderr
    assert started.json()["status"] in {"queued", "running", "verifying", "succeeded"}
    result = wait_until_done(cli, task_id, deadline_s=120)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True


def test_start_wait_runs_in_the_foreground_and_logs_follow_prints_to_the_end(
    cli, repo, docker_images
):
    mock = {"mock": {"write": {"f.txt": "f"}, "summary": "all done"}}
    task_id = cli("tasks", "create", *task_flags(repo, "fg", metadata=mock)).stdout.strip()
    run = cli("tasks", "start", task_id, "--wait")
    assert run.code == 0, run.stderr
    assert f"task {task_id}: succeeded" in run.stdout
    logs = cli("tasks", "logs", task_id, "--follow")
    assert logs.code == 0
    assert "wrote f.txt" in logs.stdout
    assert logs.stdout.strip().splitlines()[-1].split()[2] == "task.status"


def test_starting_a_finished_task_again_is_refused(cli, repo, docker_images):
    run = cli(
        "tasks", "run", "--repo", str(repo), "--worker", "mock", "--objective", "once", "--json"
    )
    task_id = run.json()["task_id"]
    again = cli("tasks", "start", task_id, "--wait")
    assert again.code == 1
    assert "already succeeded" in again.stderr


def test_list_filters_by_status_and_rejects_an_unknown_status(cli, repo, workdir):
    spec = write_spec(workdir / "t.json", mock_task(repo, {}))
    ids = [cli("tasks", "create", "--spec", str(spec)).stdout.strip() for _ in range(2)]
    listed = cli("tasks", "list", "--json").json()["tasks"]
    assert [t["task_id"] for t in listed] == list(reversed(ids))
    assert cli("tasks", "list", "--status", "running", "--json").json() == {"tasks": []}
    bad = cli("tasks", "list", "--status", "sleeping")
    assert bad.code == 2 and "Unknown status" in bad.stderr


def test_an_unknown_task_id_is_a_usage_error_with_a_hint(cli):
    result = cli("tasks", "show", "nope")
    assert result.code == 2
    assert result.stderr.strip() == (
        "worker-bridge: No task 'nope' in this store; `worker-bridge tasks list` shows the ids."
    )


def test_a_missing_subcommand_is_a_one_line_usage_error(cli):
    result = cli("tasks")
    assert result.code == 2
    assert len(result.stderr.strip().splitlines()) == 1


def test_logs_follow_prints_each_event_while_the_task_still_runs(cli, home, repo, docker_images):
    """A reader at the other end of a pipe (a script, `| grep`) sees the worker start while the
    worker is still running, not everything at the end."""
    mock = {"mock": {"sleep": 60}}
    task_id = cli("tasks", "create", *task_flags(repo, "slow", metadata=mock)).stdout.strip()
    assert cli("tasks", "start", task_id).code == 0
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    env.pop("PYTHONUNBUFFERED", None)  # stdout buffered, as a pipe's is by default
    follow = subprocess.Popen(
        [*CLI, "tasks", "logs", task_id, "--follow"], stdout=subprocess.PIPE, text=True, env=env
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(follow.stdout or ()), daemon=True)
    reader.start()
    try:
        poll(lambda: any(" worker.started " in line for line in seen), "worker.started", 60)
        assert show_task(cli, task_id)["status"] == "running"
    finally:
        cli("tasks", "cancel", task_id)
        follow.wait(timeout=60)
    assert follow.returncode == 0


def test_a_spec_given_by_process_substitution_is_read(cli, repo, home):
    """`--spec <(...)` names /dev/fd/N, a pipe that only this shell's child can open."""
    spec = json.dumps(mock_task(repo, {}, objective="from a pipe"))
    script = f'exec "$@" --spec <(printf %s {shlex.quote(spec)})'
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    done = subprocess.run(
        ["bash", "-c", script, "bash", *CLI, "tasks", "create", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["objective"] == "from a pipe"


def test_a_confined_callers_command_runs_confined(cli, repo, home, workdir):
    """A caller that may not write (Landlock) gets a command that may not either: it fails with
    one sentence, and no task was written by any less confined process on its behalf."""
    spec = write_spec(workdir / "t.json", mock_task(repo, {}))
    assert cli("tasks", "list", "--json").code == 0  # the store exists, made unconfined
    argv = confined([*CLI, "tasks", "create", "--spec", str(spec)])
    if argv is None:
        pytest.skip("this kernel has no Landlock")
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith("worker-bridge: The store ") and "Traceback" not in done.stderr
    assert cli("tasks", "list", "--json").json() == {"tasks": []}
