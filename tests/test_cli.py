"""CLI surfaces not covered elsewhere: create + start (detached and --wait), logs --follow,
list filters, and the usage errors of the parser itself."""

from __future__ import annotations

from support.tasks import mock_task, task_flags, wait_until_done, write_spec


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
