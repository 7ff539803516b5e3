"""The circuit breaker through the real engine: failures from two processes (a CLI subprocess
and the library) open a worker's circuit, every front end refuses a new task with the one
sentence and shows the state, one task is let through after the cool-down and its success
closes the circuit; jobs skip a worker whose circuit is open (and a compete with no other
worker is refused); a task that ends from waiting_input, denied from another process, is
counted; a probe whose runner was killed lets the next task try the worker. The breaker's
logic in detail: test_circuit.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.asking import block
from support.jobs import compete_task, wait_job
from support.tasks import mock_task, run_spec, start_spec, task_flags, wait_for_event
from support.waiting import poll

from bridge import WorkerBridge
from bridge.errors import CircuitOpen
from bridge.workers.circuit import circuits_of

pytestmark = pytest.mark.usefixtures("docker_images")


def circuit_of(home: Path, worker: str = "mock") -> dict:
    bridge = WorkerBridge(home=home)
    try:
        return circuits_of(bridge.config, [worker])[worker].document()
    finally:
        bridge.close()


def test_failures_from_two_processes_open_it_then_one_task_tries_it_and_closes_it(cli, home, repo):
    (home / "config.yaml").write_text("circuit: {failures: 2, window_s: 600, cooldown_s: 10}\n")
    failing = task_flags(repo, "fail", metadata={"mock": {"exit_code": 3}})
    first = cli("tasks", "run", *failing, "--json")
    assert first.code == 1 and first.json()["error"]["kind"] == "worker_exit"
    assert circuit_of(home)["state"] == "closed"
    library = WorkerBridge(home=home)  # a second process's view: its own store connection
    task = library.create_task(mock_task(repo, {"exit_code": 3}))
    assert library.run_task(task.task_id).error.kind == "worker_exit"
    library.close()

    refused = cli("tasks", "create", *task_flags(repo, "next"))
    assert refused.code == 1 and refused.stdout == ""
    [line] = refused.stderr.strip().splitlines()
    opened = circuit_of(home)
    assert opened["state"] == "open" and opened["kinds"] == {"worker_exit": 2}
    assert f"Worker 'mock' is refused until {opened['retry_at']}" in line
    assert "2 failures" in line and "workers reset mock" in line
    listed = {w["name"]: w for w in cli("workers", "list", "--json").json()["workers"]}
    assert listed["mock"]["circuit"] == opened and listed["mock"]["healthy"] is True
    assert listed["codex"]["circuit"]["state"] == "closed"
    assert "circuit refusing new tasks until" in cli("workers", "list").stdout
    doctor = cli("doctor", "--json")
    assert doctor.code == 0, "an open circuit is a warning, not a reason tasks cannot run"
    [check] = [c for c in doctor.json()["checks"] if c["check"] == "circuit:mock"]
    assert check["severity"] == "warning" and f"until {opened['retry_at']}" in check["detail"]

    poll(lambda: circuit_of(home)["state"] == "half_open", "the cool-down", 20)
    probe = cli("tasks", "run", *task_flags(repo, "try", metadata={"mock": {"summary": "ok"}}))
    assert probe.code == 0, probe.stderr
    assert circuit_of(home) == {**circuit_of(home), "state": "closed", "failures": 0}
    assert cli("tasks", "create", *task_flags(repo, "after")).code == 0


def test_jobs_skip_a_worker_whose_circuit_is_open_and_say_so(home, repo):
    (home / "config.yaml").write_text("circuit: {failures: 1, cooldown_s: 300}\n")
    bridge = WorkerBridge(home=home)
    bridge.link_worker("flaky", ["sh", "-c", "echo 'the key was refused' >&2; exit 3"])
    broken = bridge.create_task({**mock_task(repo, {}), "worker": "flaky", "metadata": {}})
    assert bridge.run_task(broken.task_id).error.kind == "worker_exit"
    assert circuits_of(bridge.config, ["flaky"])["flaky"].state == "open"

    spec = compete_task(repo, [{"write": {"notes.txt": "one\n"}}], verify=["test -f notes.txt"])
    spec["metadata"]["type"] = "chore"  # each candidate's own task is filled by its profile
    job = bridge.compete(spec, ["mock", "flaky"])
    [skipped] = job.skipped
    assert skipped["worker"] == "flaky" and skipped["role"] == "candidate"
    assert skipped["reason"].startswith("Worker 'flaky' is refused until")
    ended = wait_job(bridge, job.job_id)
    assert ended.status == "succeeded", ended.error
    assert [t.worker for t in ended.tasks] == ["mock"] and ended.skipped == job.skipped
    candidate = bridge.get_task(ended.tasks[0].task_id)
    assert candidate.profile == {"type": "chore", "filled": ["priority", "limits.timeout_seconds"]}
    created = bridge.store.events(job.job_id, kinds=("job.created",))[0]
    assert created.data["skipped"] == job.skipped

    with pytest.raises(CircuitOpen, match="Worker 'flaky' is refused until"):
        bridge.compete(spec, ["flaky"], attempts=2)
    with pytest.raises(CircuitOpen, match="'flaky'"):
        bridge.fanout({**spec, "worker": "flaky"}, ["a", "b"])
    with pytest.raises(CircuitOpen, match="'flaky'"):
        bridge.review(spec, "flaky", "mock")
    assert len(bridge.list_jobs()) == 1, "a refused job leaves nothing behind"
    bridge.close()


def test_a_failure_held_while_the_task_waited_counts_once_another_process_denies(
    cli, home, repo, workdir
):
    (home / "config.yaml").write_text("circuit: {failures: 1, cooldown_s: 300}\n")
    question = block({"kind": "question", "text": "Which key?"})
    asked = run_spec(cli, workdir, mock_task(repo, {"exit_code": 3, "summary": question}))
    assert asked["status"] == "waiting_input", asked
    assert circuit_of(home)["state"] == "closed", "held, not counted yet"
    [request] = asked["requests"]
    denied = cli("tasks", "answer", asked["task_id"], request["request_id"], "--deny", "--json")
    assert denied.code == 0, denied.stderr
    assert denied.json()["error"]["kind"] == "worker_exit"
    opened = circuit_of(home)
    assert opened["state"] == "open" and opened["kinds"] == {"worker_exit": 1}
    refused = cli("tasks", "create", *task_flags(repo, "next"))
    assert refused.code == 1 and "Worker 'mock' is refused until" in refused.stderr


@pytest.mark.usefixtures("no_task_outlives_the_test")
def test_a_probe_whose_runner_was_killed_lets_the_next_task_try_the_worker(
    cli, home, repo, workdir, monkeypatch
):
    import os
    import signal

    import psutil

    import bridge.workers.circuit

    (home / "config.yaml").write_text("circuit: {failures: 1, cooldown_s: 1}\n")
    failing = cli("tasks", "run", *task_flags(repo, "f", metadata={"mock": {"exit_code": 3}}))
    assert failing.code == 1
    poll(lambda: circuit_of(home)["state"] == "half_open", "the cool-down", 20)
    stuck = start_spec(cli, workdir, mock_task(repo, {"sleep": 600}))
    wait_for_event(cli, stuck, "worker.started")
    library = WorkerBridge(home=home)
    with pytest.raises(CircuitOpen, match=f"being tried again with task {stuck}"):
        library.create_task(mock_task(repo, {}))  # its live runner holds the one try
    [row] = library.store.query("SELECT runner_pid FROM tasks WHERE task_id = ?", (stuck,))
    pid = row["runner_pid"]
    os.kill(pid, signal.SIGKILL)  # the detached runner this test started, by its id
    poll(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", "death")
    monkeypatch.setattr(
        bridge.workers.circuit, "PROBE_GRACE_S", 0.0
    )  # the cool-down (1 s) is the wait

    def admitted():
        try:
            return library.create_task(mock_task(repo, {"summary": "ok"}))
        except CircuitOpen:
            return None  # within the cool-down from when the probe was let through

    taken = poll(admitted, "the dead runner's probe to let go", 20)
    released = library.store.events(stuck, kinds=("circuit.probe_released",))
    assert [e.data for e in released] == [{"why": "no_live_runner", "status": "running"}]
    assert library.run_task(taken.task_id).status == "succeeded"
    assert circuit_of(home)["state"] == "closed"
    library.cancel_task(stuck)  # its container is still running: the cancel kills it
    library.close()
