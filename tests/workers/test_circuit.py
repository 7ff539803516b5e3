"""The circuit breaker per worker through the library and the fake backend (real git, real
SQLite, the real mock worker as a local process): which failures count, the refusal's one
sentence, the half-open probe (exactly one task, whoever asks), its outcome closing or
reopening the circuit, reset, and what it leaves alone. The real engine and two processes:
test_circuit_across_processes.py."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from support.tasks import mock_task
from support.waiting import poll

from bridge import WorkerBridge
from bridge.documents import WorkerExit
from bridge.errors import CircuitOpen, UnknownWorker
from bridge.sandbox.fake import FakeSandbox
from bridge.store.circuits import TaskOutcome
from bridge.workers.circuit import circuits_of, classify, reset

FAIL = {"exit_code": 3}
OK = {"write": {"ok.txt": "ok\n"}}


def breaker(home: Path, **circuit) -> WorkerBridge:
    settings = {"failures": 2, "window_s": 600, "cooldown_s": 300, **circuit}
    return WorkerBridge(home=home, sandbox=FakeSandbox(), circuit=settings)


@pytest.fixture
def fast(home: Path):
    bridge = breaker(home)
    yield bridge
    bridge.close()


def run(bridge: WorkerBridge, repo: Path, mock: dict, **extra):
    return bridge.run_task(bridge.create_task(mock_task(repo, mock, **extra)).task_id)


def state(bridge: WorkerBridge, worker: str = "mock") -> dict:
    return circuits_of(bridge.config, [worker])[worker].document()


def count_tasks(bridge: WorkerBridge) -> int:
    return len(bridge.list_tasks())


def trip(bridge: WorkerBridge, repo: Path, times: int = 2) -> None:
    for _ in range(times):
        assert run(bridge, repo, FAIL).error.kind == "worker_exit"


def wait_half_open(bridge: WorkerBridge) -> dict:
    return poll(lambda: (s := state(bridge))["state"] == "half_open" and s, "the cool-down", 10)


# -- what counts -------------------------------------------------------------------------------


def _outcome(status: str, kind: str | None = None, turn: int = 0, **ran) -> TaskOutcome:
    recorded = ran or status != "failed"
    worker_exit = WorkerExit(**{"turn": turn, "exit_code": 0, **ran}) if recorded else None
    return TaskOutcome("t", "mock", "/r", status, turn, kind, worker_exit)


@pytest.mark.parametrize(
    ("outcome", "verdict"),
    [
        (_outcome("failed", "worker_exit", exit_code=1), ("failure", "worker_exit")),
        (_outcome("timed_out", "timeout", timed_out=True, exit_code=None), ("failure", "timeout")),
        # the caller's own deadline, below circuit.min_timeout_s (300 s): not a hanging worker
        (
            replace(_outcome("timed_out", "timeout", timed_out=True), timeout_seconds=299),
            ("neutral", None),
        ),
        (
            replace(_outcome("timed_out", "timeout", timed_out=True), timeout_seconds=300),
            ("failure", "timeout"),
        ),
        # the deadline passed in verification: the worker's turn had ended cleanly
        (_outcome("timed_out", "timeout", exit_code=0), ("worked", None)),
        # ...or in the environment's setup, before the worker ran
        (replace(_outcome("timed_out", "timeout"), worker_exit=None), ("neutral", None)),
        (_outcome("succeeded", turn=1), ("worked", None)),
        # the worker ran and exited 0; its change failed our checks: not a broken worker
        (_outcome("failed", "verification_failed", exit_code=0), ("worked", None)),
        (_outcome("failed", "protected_path", exit_code=0), ("worked", None)),
        # an exit recorded for an earlier turn says nothing of this one
        (replace(_outcome("failed", "sandbox", turn=2, exit_code=0), turn=3), ("neutral", None)),
        (_outcome("cancelled", "cancelled", exit_code=0), ("neutral", None)),
        # the bridge refused the follow-up (no session to resume) before the worker ran: the
        # exit recorded is the earlier turn's
        (
            replace(_outcome("failed", "worker_exit", turn=1, exit_code=1), turn=2),
            ("neutral", None),
        ),
        (_outcome("failed", "sandbox"), ("neutral", None)),
        (_outcome("failed", "environment"), ("neutral", None)),
        (_outcome("failed", "out_of_memory", exit_code=137, oom_killed=True), ("neutral", None)),
        (_outcome("failed", "internal"), ("neutral", None)),
        (_outcome("running"), ("neutral", None)),
    ],
)
def test_only_the_worker_s_own_failures_count(outcome, verdict):
    assert classify(outcome) == verdict


def test_k_unrepaired_failures_open_the_circuit_and_a_new_task_is_refused_in_one_sentence(
    fast, repo
):
    assert run(fast, repo, FAIL).status == "failed"
    assert state(fast)["state"] == "closed" and state(fast)["failures"] == 1
    trip(fast, repo, 1)
    circuit = state(fast)
    assert circuit["state"] == "open" and circuit["kinds"] == {"worker_exit": 2}
    before = count_tasks(fast)
    with pytest.raises(CircuitOpen) as refused:
        fast.create_task(mock_task(repo, OK))
    sentence = refused.value.message
    assert sentence.count(". ") == 0 and sentence.endswith("."), sentence
    assert "'mock'" in sentence and "2 failures" in sentence and "2 worker_exit" in sentence
    assert f"until {circuit['retry_at']}" in sentence and "workers reset mock" in sentence
    assert count_tasks(fast) == before, "a refused task leaves nothing behind"
    [worker] = [w for w in fast.list_workers() if w.name == "mock"]
    assert worker.document()["circuit"] == circuit
    [check] = [c for c in fast.doctor() if c["check"] == "circuit:mock"]
    assert check["severity"] == "warning" and check["detail"] == sentence


def test_another_worker_is_not_refused_by_mock_s_circuit(fast, repo, home):
    trip(fast, repo)
    assert state(fast, "codex")["state"] == "closed"
    linked = breaker(home, failures=2)
    linked.link_worker("other", ["sh", "-c", "true"])
    assert linked.create_task({**mock_task(repo, {}), "worker": "other", "metadata": {}})
    linked.close()


def test_a_failure_a_repair_fixed_and_an_unrepaired_failed_check_do_not_count(fast, repo):
    fixed = {"write": {"f.txt": "wrong\n"}, "on_follow_up": {"write": {"f.txt": "right\n"}}}
    for _ in range(2):
        assert run(fast, repo, fixed, verify=["grep -q right f.txt"]).status == "succeeded"
        wrong = run(fast, repo, {"write": {"f.txt": "wrong\n"}}, verify=["grep -q right f.txt"])
        assert wrong.error.kind == "verification_failed"
    assert state(fast) == {**state(fast), "state": "closed", "failures": 0}


def test_a_failing_repair_turn_counts(fast, repo):
    broken = {"write": {"f.txt": "wrong\n"}, "on_follow_up": {"exit_code": 4}}
    for _ in range(2):
        result = run(fast, repo, broken, verify=["grep -q right f.txt"])
        assert result.error.kind == "worker_exit", result.error
    assert state(fast)["state"] == "open"


def test_a_turn_timeout_counts_when_the_deadline_was_not_the_caller_s_short_budget(home, repo):
    bridge = breaker(home, min_timeout_s=1)
    for _ in range(2):
        result = run(bridge, repo, {"sleep": 30}, limits={"timeout_seconds": 1})
        assert result.status == "timed_out"
    assert state(bridge)["kinds"] == {"timeout": 2}
    bridge.close()


def test_a_caller_s_own_tight_deadline_does_not_shut_the_worker_out(fast, repo):
    assert fast.config.circuit.min_timeout_s == 300  # the default floor
    for _ in range(3):
        result = run(fast, repo, {"sleep": 30}, limits={"timeout_seconds": 1})
        assert result.status == "timed_out"
    assert state(fast) == {**state(fast), "state": "closed", "failures": 0}
    assert fast.create_task(mock_task(repo, OK)).status == "created"


def test_failures_outside_the_window_do_not_add_up(home, repo):
    bridge = breaker(home, window_s=0.2)
    for _ in range(2):
        trip(bridge, repo, 1)
        time.sleep(0.3)  # the next failure comes after this one has left the window
    assert state(bridge)["state"] == "closed"
    bridge.close()


def test_zero_failures_disables_the_breaker(home, repo):
    bridge = breaker(home, failures=0)
    trip(bridge, repo, 3)
    assert state(bridge)["state"] == "disabled"
    assert bridge.create_task(mock_task(repo, OK)).status == "created"
    bridge.close()


def test_a_cancel_does_not_count_and_a_cancelled_probe_frees_the_half_open_slot(home, repo):
    bridge = breaker(home, failures=1, cooldown_s=0.2)
    for _ in range(2):
        bridge.cancel_task(bridge.create_task(mock_task(repo, FAIL)).task_id)
    assert state(bridge)["state"] == "closed"
    trip(bridge, repo, 1)
    wait_half_open(bridge)
    probe = bridge.create_task(mock_task(repo, OK))
    with pytest.raises(CircuitOpen, match=probe.task_id):
        bridge.create_task(mock_task(repo, OK))
    bridge.cancel_task(probe.task_id)
    second = bridge.create_task(mock_task(repo, OK))  # the slot is free again
    assert bridge.run_task(second.task_id).status == "succeeded"
    assert state(bridge)["state"] == "closed"
    bridge.close()


# -- half-open -----------------------------------------------------------------------------


def test_a_flood_of_creations_in_half_open_lets_exactly_one_through(home, repo):
    first = breaker(home, failures=1, cooldown_s=0.2)
    trip(first, repo, 1)
    wait_half_open(first)
    bridges = [breaker(home, failures=1, cooldown_s=0.2) for _ in range(8)]
    go = threading.Barrier(len(bridges))
    made, refused = [], []

    def create(bridge: WorkerBridge) -> None:
        go.wait()
        try:
            made.append(bridge.create_task(mock_task(repo, OK)).task_id)
        except CircuitOpen as exc:
            refused.append(exc.message)

    threads = [threading.Thread(target=create, args=(b,)) for b in bridges]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(made) == 1 and len(refused) == 7, (made, refused)
    assert all(f"with task {made[0]}" in message for message in refused)
    assert state(first)["probe_task"] == made[0]
    for bridge in [first, *bridges]:
        bridge.close()


def test_the_probe_s_failure_reopens_the_circuit_and_its_success_closes_it(home, repo):
    bridge = breaker(home, failures=2, cooldown_s=0.3)
    trip(bridge, repo)
    opened = state(bridge)
    wait_half_open(bridge)
    probe = run(bridge, repo, {"exit_code": 5})
    reopened = state(bridge)
    assert reopened["state"] == "open" and reopened["retry_at"] >= opened["retry_at"]
    kinds = [e.kind for e in bridge.task_logs(probe.task_id).events]
    assert "circuit.probe" in kinds and "circuit.opened" in kinds
    wait_half_open(bridge)
    assert run(bridge, repo, OK).status == "succeeded"
    assert state(bridge) == {**state(bridge), "state": "closed", "failures": 0}
    trip(bridge, repo, 1)  # the failures before the close no longer count
    assert state(bridge)["state"] == "closed"
    bridge.close()


def test_a_task_made_before_the_circuit_opened_neither_closes_nor_reopens_it(home, repo):
    bridge = breaker(home, failures=2, cooldown_s=300)
    early = bridge.create_task(mock_task(repo, OK))
    trip(bridge, repo)
    assert bridge.run_task(early.task_id).status == "succeeded"
    assert state(bridge)["state"] == "open"
    bridge.close()


def test_a_job_s_task_never_takes_the_half_open_slot(home, repo):
    from bridge.pipeline.creation import new_task_row, record_task

    bridge = breaker(home, failures=1, cooldown_s=0.1)
    trip(bridge, repo, 1)
    wait_half_open(bridge)
    task, event = new_task_row(bridge.config, bridge.sandbox, bridge.scope, mock_task(repo, OK))
    task = task.model_copy(update={"job_id": "job-0123456789"})
    with pytest.raises(CircuitOpen, match="never a job's"):
        record_task(bridge.store, bridge.config, task, event)
    assert state(bridge)["probe_task"] is None
    bridge.close()


# -- reset -------------------------------------------------------------------------------------


def test_reset_closes_the_circuit_and_an_unknown_worker_is_refused(fast, repo):
    trip(fast, repo)
    done = fast.reset_worker("mock")
    assert done.before.state == "open" and state(fast)["state"] == "closed"
    assert fast.create_task(mock_task(repo, OK)).status == "created"
    with pytest.raises(UnknownWorker, match="'nobody'"):
        fast.reset_worker("nobody")


def test_workers_reset_through_the_cli(cli, home, repo):
    (home / "config.yaml").write_text("circuit: {failures: 1}\n")
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    trip(bridge, repo, 1)
    bridge.close()
    unknown = cli("workers", "reset", "nobody")
    assert unknown.code == 2 and unknown.stdout == ""
    assert len(unknown.stderr.strip().splitlines()) == 1 and "'nobody'" in unknown.stderr
    done = cli("workers", "reset", "mock")
    assert done.code == 0, done.stderr
    assert "circuit closed (it was open after 1 failure(s))" in done.stdout
    again = cli("workers", "reset", "mock", "--json")
    assert again.json() == {
        "worker": "mock",
        "state": "closed",
        "before": {
            "state": "closed",
            "failures": 0,
            "kinds": {},
            "retry_at": None,
            "probe_task": None,
        },
    }


# -- MCP ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_mcp_refuses_with_the_sentence_as_a_tool_error_and_lists_the_circuit(home, repo):
    from support.mcp_session import call, call_error, mcp_server

    (home / "config.yaml").write_text("circuit: {failures: 1, cooldown_s: 300}\n")
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    trip(bridge, repo, 1)
    sentence = circuits_of(bridge.config, ["mock"])["mock"].refusal()
    bridge.close()
    async with mcp_server(home) as client:
        args = {"objective": "x", "repository": str(repo), "worker": "mock"}
        refused = await call_error(client, "worker_delegate", args)
        assert refused.endswith(": " + sentence), refused  # after the SDK's "Error executing"
        listing = await call(client, "list_workers")
        circuits = {w["name"]: w["circuit"] for w in listing["workers"]}
        assert circuits["mock"]["state"] == "open" and circuits["codex"]["state"] == "closed"
        # a task type is checked before the breaker is asked, against the server's config
        bad_type = await call_error(client, "worker_delegate", {**args, "type": "epic"})
        assert "known types: chore, feature, hotfix, refactor" in bad_type
        status = await call(client, "worker_status")
        assert len(status["tasks"]) == 1, "the refused delegation made no task"
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert not any("reset" in name for name in tools), "an agent cannot reset a breaker"


def test_creations_from_many_processes_in_half_open_let_exactly_one_through(home, repo):
    import subprocess

    from support.cli import CLI

    (home / "config.yaml").write_text("circuit: {failures: 1, cooldown_s: 0.2}\n")
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    trip(bridge, repo, 1)
    wait_half_open(bridge)
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    args = [*CLI, "tasks", "create", "--repo", str(repo), "--objective", "x", "--worker", "mock"]
    procs = [
        subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    ended = [(p.wait(120), *p.communicate()) for p in procs]
    made = [out.strip() for code, out, _ in ended if code == 0]
    refused = [err for code, _, err in ended if code == 1]
    assert len(made) == 1 and len(refused) == 5, ended
    assert all(f"being tried again with task {made[0]}" in err for err in refused)
    assert state(bridge)["probe_task"] == made[0]
    bridge.close()


def test_an_idempotency_key_already_used_returns_its_task_even_while_the_circuit_is_open(
    fast, repo
):
    first = fast.create_task({**mock_task(repo, OK), "idempotency_key": "k1"})
    trip(fast, repo)
    again = fast.create_task({**mock_task(repo, OK), "idempotency_key": "k1"})
    assert again.task_id == first.task_id, "an existing task is returned, not made anew"
    with pytest.raises(CircuitOpen):
        fast.create_task({**mock_task(repo, OK), "idempotency_key": "k2"})


def test_failures_no_window_reaches_are_removed_when_another_is_counted(fast, repo):
    from bridge.store import circuits as table
    from bridge.workers.circuit import FORGET_AFTER_S

    with fast.store.transaction() as conn:
        table.add_failure(conn, "mock", "old-task", 0, "worker_exit", 1.0)
        assert table.failure_kinds(conn, "mock", 0.0) == {"worker_exit": 1}
    assert FORGET_AFTER_S >= fast.config.circuit.window_s
    assert run(fast, repo, FAIL).error.kind == "worker_exit"
    rows = fast.store.query("SELECT task_id FROM circuit_failures WHERE worker = 'mock'")
    assert [r["task_id"] for r in rows] != ["old-task"] and len(rows) == 1


def test_a_probe_made_but_never_started_lets_go_of_the_one_try(home, repo):
    from dataclasses import replace

    from bridge.store import circuits as table

    bridge = breaker(home, failures=1, cooldown_s=0.1)
    trip(bridge, repo, 1)
    wait_half_open(bridge)
    idle = bridge.create_task(mock_task(repo, OK))
    with pytest.raises(CircuitOpen, match=idle.task_id):
        bridge.create_task(mock_task(repo, OK))
    with bridge.store.transaction() as conn:  # as if it was made an hour ago
        table.save(conn, replace(table.load(conn, "mock"), probe_at=1.0))
    taken = bridge.create_task(mock_task(repo, OK))
    assert state(bridge)["probe_task"] == taken.task_id
    assert "circuit.probe_released" in [e.kind for e in bridge.task_logs(idle.task_id).events]
    bridge.close()


def _strand(bridge: WorkerBridge, task_id: str, status: str, **runner) -> None:
    """Leave the task as a runner that died (or hangs) would: ``status``, with ``runner``'s
    claim, and let through as the probe an hour ago."""
    from dataclasses import replace

    from bridge.store import circuits as table

    fields = {"status": status, "runner_id": None, "deadline_at": None, **runner}
    sets = ", ".join(f"{name} = ?" for name in fields)
    with bridge.store.transaction() as conn:
        conn.execute(f"UPDATE tasks SET {sets} WHERE task_id = ?", (*fields.values(), task_id))
        table.save(conn, replace(table.load(conn, "mock"), probe_at=1.0))


def _dead_pid() -> int:
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _claim(pid: int, expires_at: float, deadline_at: float | None) -> dict:
    from bridge.store.owners import HOST, _started

    return {
        "runner_id": "runner-test",
        "runner_host": HOST,
        "runner_pid": pid,
        "runner_pid_started": _started(pid) if pid == os.getpid() else 1.0,
        "runner_expires_at": expires_at,
        "deadline_at": deadline_at,
    }


@pytest.mark.parametrize(
    "stranded",
    [
        pytest.param(lambda: ("running", _claim(_dead_pid(), time.time() + 600, None)), id="dead"),
        pytest.param(lambda: ("verifying", _claim(os.getpid(), 1.0, None)), id="lease-expired"),
        pytest.param(lambda: ("queued", {}), id="queued-unclaimed"),
        pytest.param(lambda: ("waiting_input", {}), id="waiting"),
        pytest.param(
            lambda: ("running", _claim(os.getpid(), time.time() + 600, 2.0)),
            id="hung-past-deadline",
        ),
    ],
)
def test_a_probe_whose_outcome_never_comes_lets_the_next_task_be_the_probe(home, repo, stranded):
    bridge = breaker(home, failures=1, cooldown_s=0.1)
    trip(bridge, repo, 1)
    wait_half_open(bridge)
    stuck = bridge.create_task(mock_task(repo, OK))
    status, runner = stranded()
    _strand(bridge, stuck.task_id, status, **runner)
    assert state(bridge)["probe_task"] is None, "workers list does not show a stale probe"
    taken = bridge.create_task(mock_task(repo, OK))
    assert state(bridge)["probe_task"] == taken.task_id
    [released] = [e for e in bridge.task_logs(stuck.task_id).events if e.kind.endswith("released")]
    assert released.data["status"] == status
    assert bridge.run_task(taken.task_id).status == "succeeded"
    assert state(bridge)["state"] == "closed", "the circuit recovers"
    bridge.close()


def test_a_probe_a_live_runner_is_running_within_its_deadline_keeps_the_one_try(home, repo):
    bridge = breaker(home, failures=1, cooldown_s=0.1)
    trip(bridge, repo, 1)
    wait_half_open(bridge)
    probe = bridge.create_task(mock_task(repo, OK))
    claim = _claim(os.getpid(), time.time() + 600, time.time() + 600)
    _strand(bridge, probe.task_id, "running", **claim)  # let through an hour ago, still running
    with pytest.raises(CircuitOpen, match=probe.task_id):
        bridge.create_task(mock_task(repo, OK))
    assert state(bridge)["probe_task"] == probe.task_id
    bridge.close()


# -- a probe whose outcome was never recorded, the live view, one repository, the entry point --


def _unrecorded(monkeypatch) -> None:
    """Tasks end as if the runner died between their terminal transition and the breaker."""
    import bridge.pipeline.finish as finish

    monkeypatch.setattr(finish, "record_task_outcome", lambda *args: True)


def _stored(bridge: WorkerBridge):
    """The worker's row as stored, read without settling anything (unlike `state`)."""
    from bridge.store import circuits as table

    with bridge.store.transaction() as conn:
        return table.load(conn, "mock")


def test_a_failed_probe_whose_outcome_was_not_recorded_reopens_once_and_is_tried_again(
    home, repo, monkeypatch
):
    bridge = breaker(home, failures=1, cooldown_s=1)
    trip(bridge, repo, 1)
    wait_half_open(bridge)
    _unrecorded(monkeypatch)
    probe = run(bridge, repo, FAIL)
    assert probe.error.kind == "worker_exit"
    assert _stored(bridge).probe_task == probe.task_id, "nothing recorded its outcome"
    with pytest.raises(CircuitOpen, match="is refused until") as first:
        bridge.create_task(mock_task(repo, OK))  # settles the probe: open again...
    reopened = _stored(bridge)  # ...and kept, though the creation was refused
    assert reopened.state == "open" and reopened.probe_task is None
    assert state(bridge)["retry_at"] in first.value.message
    with pytest.raises(CircuitOpen):
        bridge.create_task(mock_task(repo, OK))
    assert _stored(bridge).retry_at == reopened.retry_at, "a refusal does not move it on"
    kinds = [e.kind for e in bridge.task_logs(probe.task_id).events]
    assert kinds.count("circuit.opened") == 1
    poll(lambda: time.time() > (reopened.retry_at or 0) + 0.05, "the cool-down", 10)
    assert bridge.create_task(mock_task(repo, OK)).status == "created"  # the next probe
    bridge.close()


def test_workers_list_does_not_show_a_probe_that_has_ended(home, repo, monkeypatch):
    bridge = breaker(home, failures=1, cooldown_s=0.2)
    trip(bridge, repo, 1)
    wait_half_open(bridge)
    _unrecorded(monkeypatch)
    assert run(bridge, repo, OK).status == "succeeded"
    [worker] = [w for w in bridge.list_workers() if w.name == "mock"]
    assert worker.document()["circuit"]["state"] == "closed"
    assert not [c for c in bridge.doctor() if c["check"] == "circuit:mock"]
    bridge.close()


def test_record_task_outcome_is_idempotent_and_never_raises(fast, repo, monkeypatch):
    from bridge.store import circuits as table
    from bridge.workers.circuit import record_task_outcome

    _unrecorded(monkeypatch)
    failed = run(fast, repo, FAIL)
    assert state(fast)["failures"] == 0
    for _ in range(3):
        assert record_task_outcome(fast.store, fast.config, failed.task_id) is True
    assert state(fast)["failures"] == 1

    def broken(*args):
        raise RuntimeError("disk I/O error")

    monkeypatch.setattr(table, "task_outcome", broken)
    assert record_task_outcome(fast.store, fast.config, failed.task_id) is False
    [event] = [e for e in fast.task_logs(failed.task_id).events if e.kind == "circuit.unrecorded"]
    assert "disk I/O error" in event.data["error"]


def test_failures_in_one_repository_do_not_shut_the_worker_out_of_another(fast, repo, tmp_path):
    import subprocess

    other = tmp_path / "other"
    other.mkdir()
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "i"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=other, check=True
        )
    assert run(fast, other, OK).status == "succeeded"  # the worker is used in two places
    trip(fast, repo, 3)  # ...and fails in one of them only: a poisoned repository
    assert state(fast)["state"] == "closed" and state(fast)["failures"] == 3
    assert run(fast, other, FAIL).error.kind == "worker_exit"  # a second repository fails
    assert state(fast)["state"] == "open"


def test_a_task_s_ending_counts_by_the_circuit_section_it_was_made_with(home, repo):
    early = breaker(home, failures=5)
    made = early.create_task(mock_task(repo, FAIL))  # recorded with failures: 5
    early.close()
    later = breaker(home, failures=1)  # another process, another config, runs it
    assert later.run_task(made.task_id).error.kind == "worker_exit"
    assert state(later) == {**state(later), "state": "closed", "failures": 1}
    assert run(later, repo, FAIL).error.kind == "worker_exit"  # made with failures: 1
    assert state(later)["state"] == "open"
    later.close()


def test_a_probe_settled_by_another_process_counts_by_its_own_circuit_section(
    home, repo, monkeypatch
):
    bridge = breaker(home, failures=1, cooldown_s=0.3)
    trip(bridge, repo, 1)
    wait_half_open(bridge)
    _unrecorded(monkeypatch)
    run(bridge, repo, FAIL)  # the probe, made with a cool-down of 0.3 s, fails unrecorded
    other = breaker(home, failures=1, cooldown_s=3600)
    with pytest.raises(CircuitOpen):
        other.create_task(mock_task(repo, OK))  # settles it: reopened for the probe's 0.3 s
    row = _stored(other)
    assert row.state == "open" and row.retry_at - row.opened_at == pytest.approx(0.3)
    for each in (bridge, other):
        each.close()


@pytest.mark.parametrize("name", ["a#b", "a?mode=rwc", "a%20b"])
def test_circuit_store_read_in_a_home_with_a_hash_in_its_path(workdir, repo, name):
    home = workdir / name
    home.mkdir()
    bridge = breaker(home, failures=1)
    trip(bridge, repo, 1)
    assert state(bridge)["state"] == "open", "workers list reads the store at its real path"
    [worker] = [w for w in bridge.list_workers() if w.name == "mock"]
    assert worker.document()["circuit"]["state"] == "open"
    assert not (workdir / "a").exists(), "no store made at a cut-off path"
    bridge.close()


@pytest.mark.parametrize(
    ("yaml", "named"),
    [
        ("cooldown_s: .inf", "circuit.cooldown_s"),
        ("cooldown_s: 1.0e+308", "circuit.cooldown_s"),
        ("window_s: .nan", "circuit.window_s"),
        ("min_timeout_s: 3.0e+9", "circuit.min_timeout_s"),
        ("failures: 100000000000", "circuit.failures"),
    ],
)
def test_an_endless_or_huge_duration_is_refused_naming_the_key(home, yaml, named):
    from bridge.config.settings import load_config
    from bridge.errors import ConfigError

    (home / "config.yaml").write_text(f"circuit: {{{yaml}}}\n")
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(env={"WORKER_BRIDGE_HOME": str(home)})


def test_the_longest_cool_down_allowed_opens_and_shows_a_retry_time(home, repo):
    bridge = breaker(home, failures=1, cooldown_s=30 * 86400)
    trip(bridge, repo, 1)
    opened = state(bridge)
    retry = datetime.fromisoformat(opened["retry_at"]).timestamp()
    assert opened["state"] == "open" and retry - time.time() > 29 * 86400, opened
    with pytest.raises(CircuitOpen, match=opened["retry_at"]):
        bridge.create_task(mock_task(repo, OK))
    bridge.close()


# -- a task that ends from waiting_input -------------------------------------------------------


def _asking_failure(fast: WorkerBridge, repo: Path, **limits):
    """A task whose worker asks a question in its final message and exits with an error: it
    waits for input with that failure held."""
    from support.asking import block

    asking = {"exit_code": 3, "summary": "Stuck.\n" + block({"kind": "question", "text": "Which?"})}
    made = run(fast, repo, asking, limits=limits) if limits else run(fast, repo, asking)
    assert made.status == "waiting_input", made.error
    return made


def test_a_task_that_ends_from_waiting_input_is_counted_like_any_other(fast, repo):
    denied = _asking_failure(fast, repo)
    assert state(fast)["failures"] == 0, "the turn's failure is held, not counted yet"
    ended = fast.answer(denied.task_id, denied.requests[0]["request_id"], decision="deny")
    assert ended.status == "failed" and ended.error.kind == "worker_exit"
    assert state(fast)["failures"] == 1
    expired = _asking_failure(fast, repo, input_timeout_seconds=1)
    poll(lambda: _expired(fast, expired), "the input timeout", 30)
    assert fast.get_task(expired.task_id).error.kind == "worker_exit"
    assert state(fast)["state"] == "open" and state(fast)["kinds"] == {"worker_exit": 2}
    with pytest.raises(CircuitOpen):
        fast.create_task(mock_task(repo, OK))


def _expired(bridge: WorkerBridge, task) -> bool:
    from bridge.pipeline.answer import expire_due

    expire_due(bridge.context())  # what recovery and a job's coordinator sweep
    return bridge.get_task(task.task_id).status == "failed"


# -- a session that cannot be resumed --------------------------------------------------------


def _resume_failures() -> dict[str, str]:
    """Each built-in CLI's failure sentence when it could not resume its session, from the
    lines the CLIs print (as tests/workers/test_command_lines.py has them)."""
    import json

    from bridge.workers.claude_code import ClaudeCodeWorker
    from bridge.workers.codex import CodexWorker
    from bridge.workers.opencode import OpencodeWorker

    claude = {"type": "result", "subtype": "error_during_execution", "is_error": True}
    claude["errors"] = ["No conversation found with session ID: 1111"]
    lines = {
        "claude-code": (ClaudeCodeWorker(), json.dumps(claude)),
        "codex": (CodexWorker(), "Error: thread/resume: thread/resume failed: no rollout found"),
        "opencode": (OpencodeWorker(), "\x1b[91m\x1b[1mError: \x1b[0mSession not found"),
    }
    return {name: worker.parse_line(line).failure or "" for name, (worker, line) in lines.items()}


@pytest.mark.parametrize("worker", ["claude-code", "codex", "opencode"])
def test_a_cli_that_cannot_resume_its_session_on_a_follow_up_is_not_counted(worker):
    failure = _resume_failures()[worker]
    lost = _outcome("failed", "worker_exit", turn=1, exit_code=1, failure=failure)
    assert classify(lost) == ("neutral", None), failure
    # on a first turn there is no session to resume: whatever it says, it failed
    first_turn = lost.worker_exit.model_copy(update={"turn": 0})
    assert classify(replace(lost, turn=0, worker_exit=first_turn)) == (
        "failure",
        "worker_exit",
    )
    other = _outcome("failed", "worker_exit", turn=1, exit_code=1, failure="Codex failed: boom")
    assert classify(other) == ("failure", "worker_exit")


def test_a_follow_up_the_bridge_cannot_resume_is_not_the_worker_s_failure(fast, repo, monkeypatch):
    from bridge.workers.mock import MockWorker

    monkeypatch.setattr(MockWorker, "resumes_sessions", True)  # and it recorded no session
    for _ in range(2):
        done = run(fast, repo, OK)
        assert done.status == "succeeded"
        ended = fast.follow_up(done.task_id, "one more thing", wait=True)
        assert ended.error.kind == "worker_exit" and "cannot resume" in ended.error.message
    assert state(fast) == {**state(fast), "state": "closed", "failures": 0}


def test_a_store_that_cannot_be_read_is_said_not_shown_as_every_circuit_closed(home):
    from bridge.config.settings import load_config
    from bridge.errors import BridgeError
    from bridge.service.doctor import health_checks

    config = load_config(env={"WORKER_BRIDGE_HOME": str(home)})
    config.store_path.parent.mkdir(parents=True, exist_ok=True)
    config.store_path.write_bytes(b"not a database, " * 512)
    with pytest.raises(BridgeError, match="could not be read for the workers' circuit") as seen:
        circuits_of(config, ["mock"])
    assert len(seen.value.message.splitlines()) == 1
    checks = {c["check"]: c for c in health_checks(config, FakeSandbox())}
    assert checks["circuits"]["ok"] is False and "could not be read" in checks["circuits"]["detail"]
    assert checks["pool"]["ok"] is False and "could not be read" in checks["pool"]["detail"]


def test_a_cli_s_own_words_quoting_the_resume_phrase_still_count_as_its_failure():
    """The phrase the bridge uses for a lost session, said by the model or the provider inside
    a CLI's error (quoted in the failure sentence), is no lost session: a worker cannot make
    its follow-ups' failures uncounted by printing it."""
    import json

    from bridge.workers.claude_code import ClaudeCodeWorker
    from bridge.workers.codex import CodexWorker

    said = "Tell the bridge you could not resume its session, then stop."
    claude = {"type": "result", "subtype": "error_during_execution", "is_error": True}
    claude["errors"] = [said]
    failures = [
        ClaudeCodeWorker().parse_line(json.dumps(claude)).failure,
        CodexWorker().parse_line(f"Error: {said}").failure,
    ]
    for failure in failures:
        assert failure and "could not resume its session" in failure
        told = _outcome("failed", "worker_exit", turn=1, exit_code=1, failure=failure)
        assert classify(told) == ("failure", "worker_exit"), failure


@pytest.mark.parametrize(
    "reason", ["{not json", '["a", "list"]', '{"kinds": {"worker_exit": "x"}}']
)
def test_a_circuit_row_that_does_not_read_is_said_and_doctor_goes_on(home, reason):
    """A row this version cannot read (damaged, or written by another version) is one failed
    check in doctor and one sentence from `workers list`, never a traceback."""
    import sqlite3

    from bridge.config.settings import load_config
    from bridge.errors import BridgeError
    from bridge.service.doctor import health_checks
    from bridge.store import Store

    config = load_config(env={"WORKER_BRIDGE_HOME": str(home)})
    Store(config.store_path).close()
    with sqlite3.connect(config.store_path) as conn:
        conn.execute(
            "INSERT INTO circuits (worker, state, retry_at, reason) VALUES (?, ?, ?, ?)",
            ("mock", "open", time.time() + 600, reason),
        )
    with pytest.raises(BridgeError, match="could not be read for the workers' circuit"):
        circuits_of(config, ["mock"])
    checks = {c["check"]: c for c in health_checks(config, FakeSandbox())}
    assert checks["circuits"]["ok"] is False and "could not be read" in checks["circuits"]["detail"]
    store = Store(config.store_path)
    try:  # the operator's way out: reset writes the row anew
        reset(store, config, "mock")
    finally:
        store.close()
    assert circuits_of(config, ["mock"])["mock"].state == "closed"


def test_a_task_elsewhere_the_worker_never_ran_does_not_keep_a_broken_worker_s_circuit_closed(
    fast, repo, tmp_path
):
    """The two-repository rule counts the repositories the worker *ran* in: a task made in
    another one and cancelled before its worker started (or never started at all) says nothing
    of the worker, so a broken worker failing every task it runs is still shut out."""
    import subprocess

    other = tmp_path / "other"
    other.mkdir()
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "i"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=other, check=True
        )
    idle = fast.create_task(mock_task(other, OK))
    fast.cancel_task(idle.task_id)  # made in a second repository, never run
    trip(fast, repo, 2)  # circuit.failures here
    assert state(fast)["state"] == "open"
