"""The pipeline's logic through the fake backend (no engine): transitions, recovery decisions,
repair budgets, redaction and limits bookkeeping. Real git and SQLite; "containers" are local
processes (the real mock worker and `sh -c` verification commands) or scripted outcomes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from support.repos import git
from support.tasks import TERMINAL, mock_task

from bridge import WorkerBridge
from bridge.host.mountinfo import mount_points
from bridge.phase.handle import PhaseHandle, PipelineHooks
from bridge.sandbox import ContainerSpec
from bridge.sandbox.fake import FakeSandbox, Scripted
from bridge.store.owners import Owner


def fake_bridge(home: Path, sandbox: FakeSandbox | None = None, **overrides) -> WorkerBridge:
    return WorkerBridge(home=home, sandbox=sandbox or FakeSandbox(), **overrides)


@pytest.fixture
def fast(home):
    bridge = fake_bridge(home)
    yield bridge
    bridge.close()


def run(bridge: WorkerBridge, spec: dict):
    return bridge.run_task(bridge.create_task(spec).task_id)


def kinds(bridge: WorkerBridge, task_id: str) -> list[str]:
    return [e.kind for e in bridge.task_logs(task_id, limit=10_000).events]


def statuses(bridge: WorkerBridge, task_id: str) -> list[str]:
    events = bridge.task_logs(task_id, limit=10_000).events
    return [e.data["to"] for e in events if e.kind == "task.status"]


def role(spec: ContainerSpec) -> str:
    return spec.labels["io.worker-bridge.role"]


def dead_owner() -> Owner:
    """An owner whose process is gone, as a runner killed with SIGKILL leaves behind."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return Owner(pid=proc.pid, pid_started=time.time() - 3600)


class Crash(BaseException):
    """Ends a runner the way a kill would: nothing is cleaned up on the way out."""


class CrashAt(PipelineHooks):
    def __init__(self, phase: str | None = None, in_container: str | None = None) -> None:
        self.phase, self.in_container = phase, in_container
        self.phases: list[str] = []

    def phase_entered(self, handle: PhaseHandle, phase: str) -> None:
        self.phases.append(phase)
        if phase == self.phase:
            raise Crash(phase)

    def container_started(self, handle: PhaseHandle, role: str, container_id: str) -> None:
        if role == self.in_container:
            raise Crash(role)


# -- the happy path -----------------------------------------------------------------------------


def test_a_task_runs_end_to_end_through_the_fake_backend_in_under_a_second(fast, repo):
    spec = mock_task(repo, {"write": {"new.py": "X = 1\n"}}, verify=["test -f new.py", "true"])
    result = run(fast, spec)  # no engine: the whole task takes a fraction of a second here

    assert result.status == "succeeded", result.error
    assert result.verification.ok is True
    assert [c.status for c in result.verification.commands] == ["passed", "passed"]
    assert result.document()["changed_files"] == [{"path": "new.py", "change": "added"}]
    assert git(repo, "show", f"{result.branch}:new.py") == "X = 1\n"
    assert statuses(fast, result.task_id) == [
        "created",
        "queued",
        "running",
        "verifying",
        "succeeded",
    ]
    assert fast.sandbox.containers({}) == []  # every "container" removed
    assert fast.store.leases.live() == []
    assert fast.store.load_task(result.task_id).container_id is None


def test_the_phases_are_entered_in_order_and_seen_by_an_injected_hook(home, repo):
    hooks = CrashAt()
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox(), hooks=hooks)
    result = run(bridge, mock_task(repo, {"write": {"a": "a"}}, verify=["true"]))
    assert result.status == "succeeded"
    assert hooks.phases == ["allocating", "worker", "collecting", "verifying"]
    bridge.close()


# -- verdicts -----------------------------------------------------------------------------------


def test_a_failing_verify_command_fails_the_task_with_its_status_and_output(fast, repo):
    spec = mock_task(repo, {"write": {"a": "a"}}, verify=["echo out; echo err >&2; exit 3", "true"])
    spec["metadata"]["auto_repair"] = 0
    result = run(fast, spec)
    assert result.status == "failed"
    assert result.error.kind == "verification_failed"
    assert "status 3" in result.error.message
    first, second = result.verification.commands
    assert (first.exit_code, first.status) == (3, "failed")
    assert first.stdout_tail.strip() == "out" and first.stderr_tail.strip() == "err"
    assert second.status == "passed"  # every command runs, even after a failure


def test_a_worker_exiting_non_zero_fails_with_worker_exit_and_is_not_verified(fast, repo):
    result = run(fast, mock_task(repo, {"exit_code": 4}, verify=["true"]))
    assert result.status == "failed"
    assert result.error.kind == "worker_exit"
    assert "status 4" in result.error.message
    assert not [s for s in fast.sandbox.started if role(s) == "verify"]


def test_a_scripted_out_of_memory_worker_fails_with_out_of_memory(home, repo):
    sandbox = FakeSandbox(lambda spec: Scripted(exit_code=137, oom_killed=True))
    bridge = fake_bridge(home, sandbox)
    result = run(bridge, mock_task(repo, {}, limits={"memory_mb": 64}))
    assert result.error.kind == "out_of_memory"
    assert "64 MB" in result.error.message
    bridge.close()


def test_a_worker_past_the_deadline_times_the_task_out(home, repo):
    sandbox = FakeSandbox(lambda spec: Scripted(run_for=30) if role(spec) == "worker" else None)
    bridge = fake_bridge(home, sandbox)
    result = run(bridge, mock_task(repo, {}, limits={"timeout_seconds": 1}))
    assert result.status == "timed_out"
    assert result.error.kind == "timeout"
    assert sandbox.containers({}) == []
    bridge.close()


def test_commands_after_the_deadline_are_reported_as_not_run_never_passed(home, repo):
    def behaviour(spec: ContainerSpec):
        if role(spec) == "verify" and spec.labels["io.worker-bridge.command"] == "0":
            return Scripted(run_for=30)
        return None

    bridge = fake_bridge(home, FakeSandbox(behaviour))
    spec = mock_task(repo, {"write": {"a": "a"}}, verify=["sleep 30", "true"])
    spec["limits"] = {"timeout_seconds": 2}
    result = run(bridge, spec)
    assert result.status == "timed_out"
    first, second = result.verification.commands
    assert first.status == "timed_out" and first.exit_code is None
    assert second.status == "not_run" and second.exit_code is None
    assert result.verification.ok is False
    bridge.close()


def test_a_change_to_a_protected_path_fails_before_verification(fast, repo):
    spec = mock_task(repo, {"write": {"tests/test_calc.py": "x"}}, verify=["true"])
    spec["verification"]["protected_paths"] = ["tests/**"]
    result = run(fast, spec)
    assert result.error.kind == "protected_path"
    assert "tests/test_calc.py" in result.error.message


# -- repair budget ------------------------------------------------------------------------------


def test_a_failed_verification_gets_a_repair_turn_that_fixes_it(fast, repo):
    mock = {"write": {"v.txt": "bad"}, "on_follow_up": {"write": {"v.txt": "good"}}}
    result = run(fast, mock_task(repo, mock, verify=["grep -q good v.txt"]))
    assert result.status == "succeeded", result.error
    log = kinds(fast, result.task_id)
    assert log.count("verification.auto_repair") == 1
    assert log.count("worker.started") == 2
    assert git(repo, "show", f"{result.branch}:v.txt") == "good"


@pytest.mark.parametrize("budget, turns", [(0, 1), (2, 3)])
def test_the_repair_budget_bounds_the_turns(fast, repo, budget, turns):
    mock = {"write": {"v.txt": "bad"}, "on_follow_up": {"write": {"v.txt": "still bad"}}}
    spec = mock_task(repo, mock, verify=["grep -q good v.txt"])
    spec["metadata"]["auto_repair"] = budget
    result = run(fast, spec)
    assert result.status == "failed"
    assert kinds(fast, result.task_id).count("worker.started") == turns


# -- redaction ----------------------------------------------------------------------------------


def test_secrets_printed_by_the_worker_and_the_checks_are_masked_everywhere_stored(fast, repo):
    token = "ghp_" + "a1B2c3D4" * 5
    script = f"echo 'using {token}'; echo 'password=Hunter2x9'"
    spec = mock_task(repo, {"script": script}, verify=[f"echo {token}; echo Hunter2x9"])
    result = run(fast, spec)
    stored = fast.task_logs(result.task_id, limit=10_000)
    text = stored.model_dump_json() + result.model_dump_json()
    assert token not in text
    assert "Hunter2x9" not in text
    assert "[REDACTED]" in text


# -- bookkeeping and recovery -------------------------------------------------------------------


def test_a_finished_task_holds_no_lease_and_no_container(fast, repo):
    result = run(fast, mock_task(repo, {"exit_code": 1}))
    assert result.status == "failed"
    assert fast.store.leases.live() == []
    record = fast.store.load_task(result.task_id)
    assert record.container_id is None and record.runner_id


def test_a_runner_that_died_during_the_worker_is_resumed_and_adopts_its_container(home, repo):
    sandbox = FakeSandbox(
        lambda spec: (
            Scripted(run_for=0.5, output=['{"type": "result", "summary": "adopted"}'])
            if role(spec) == "worker"
            else None
        )
    )
    crashing = WorkerBridge(home=home, sandbox=sandbox, hooks=CrashAt(in_container="worker"))
    task_id = crashing.create_task(mock_task(repo, {}, verify=["true"])).task_id
    owner = dead_owner()
    with pytest.raises(Crash):
        _run_as(crashing, task_id, owner)
    assert crashing.store.status(task_id) == "running"
    assert [c.state for c in sandbox.containers({})] == ["running"]

    survivor = fake_bridge(home, sandbox)
    stranded = [row["task_id"] for row in survivor.store.runners.stranded()]
    assert stranded == [task_id]
    result = survivor.run_task(task_id, runner_id="runner-recovering")
    assert result.status == "succeeded", result.error
    assert result.summary == "adopted"
    log = kinds(survivor, task_id)
    assert log.count("worker.started") == 1 and log.count("worker.adopted") == 1
    assert "task.resumed" in log
    assert sandbox.containers({}) == []
    crashing.close()
    survivor.close()


def test_an_interrupt_removes_the_tasks_containers_and_verification_checkout_then_goes_on(
    home, repo
):
    sandbox = FakeSandbox(lambda spec: Scripted(run_for=30) if role(spec) == "worker" else None)

    class InterruptWhenStarted(PipelineHooks):
        def container_started(self, handle, role, container_id):  # noqa: ANN001
            raise KeyboardInterrupt  # Ctrl-C while the worker runs and the checkout is made

    bridge = fake_bridge(home, sandbox, hooks=InterruptWhenStarted())
    task_id = bridge.create_task(mock_task(repo, {}, verify=["true"])).task_id
    with pytest.raises(KeyboardInterrupt):
        bridge.run_task(task_id)
    assert not (home / "tasks" / task_id / "verify-0").exists()
    assert [p for p in mount_points() if "/mounts/" in p and p.startswith(f"{home}/")] == []
    assert sandbox.containers({}) == []
    assert bridge.store.status(task_id) == "running"  # for the caller to cancel, or recovery
    assert bridge.cancel_task(task_id).status == "cancelled"
    bridge.close()


def test_an_interrupt_while_a_check_runs_removes_its_container_before_its_checkout(home, repo):
    # The review's way: Ctrl-C while a check ran unwound through verification's clean-up first,
    # which moved the checkout into the trash while the check's container still wrote into it.
    mounts = f"{home}/mounts/"  # the check's layered checkout is mounted there

    class Watching(FakeSandbox):
        def remove(self, container_id: str) -> None:
            found = [c for c in self.containers({}) if c.id == container_id]
            if found and found[0].labels.get("io.worker-bridge.role") == "verify":
                held.append(any("--verify-0" in p for p in mount_points() if p.startswith(mounts)))
            super().remove(container_id)

    held: list[bool] = []
    sandbox = Watching(lambda spec: Scripted(run_for=30) if role(spec) == "verify" else None)

    class InterruptWhenChecking(PipelineHooks):
        def container_started(self, handle, role, container_id):  # noqa: ANN001
            if role == "verify":
                raise KeyboardInterrupt  # Ctrl-C while the check runs in its checkout

    bridge = fake_bridge(home, sandbox, hooks=InterruptWhenChecking())
    task_id = bridge.create_task(mock_task(repo, {}, verify=["true"])).task_id
    with pytest.raises(KeyboardInterrupt):
        bridge.run_task(task_id)
    assert held and held[0], "the check's container went while its checkout was still there"
    assert sandbox.containers({}) == []
    assert not (home / "tasks" / task_id / "verify-0").exists()
    assert [p for p in mount_points() if p.startswith(mounts)] == []
    assert bridge.cancel_task(task_id).status == "cancelled"
    bridge.close()


def _run_as(bridge: WorkerBridge, task_id: str, owner: Owner) -> None:
    from bridge.pipeline.runner import TaskRunner

    TaskRunner(bridge.context(), task_id, owner, hooks=bridge.hooks).run()


def test_a_runner_that_died_before_collecting_collects_the_recorded_exit(home, repo):
    hooks = CrashAt(phase="collecting")
    first = WorkerBridge(home=home, sandbox=FakeSandbox(), hooks=hooks)
    task_id = first.create_task(mock_task(repo, {"write": {"c.txt": "c"}}, verify=["true"])).task_id
    with pytest.raises(Crash):
        _run_as(first, task_id, dead_owner())
    second = fake_bridge(home)
    result = second.run_task(task_id, runner_id="runner-second")
    assert result.status == "succeeded", result.error
    assert kinds(second, task_id).count("worker.started") == 1  # the worker did not run again
    assert git(repo, "show", f"{result.branch}:c.txt") == "c"
    first.close()
    second.close()


def test_cancel_during_the_worker_ends_the_task_cancelled_and_removes_the_container(home, repo):
    sandbox = FakeSandbox(lambda spec: Scripted(run_for=30))
    bridge = fake_bridge(home, sandbox)

    class CancelWhenStarted(PipelineHooks):
        def container_started(self, handle, role, container_id):  # noqa: ANN001
            bridge.cancel_task(handle.task_id)

    bridge.hooks = CancelWhenStarted()
    result = run(bridge, mock_task(repo, {}))
    assert result.status == "cancelled"
    assert result.error.kind == "cancelled"
    assert statuses(bridge, result.task_id).count("cancelled") == 1
    assert sandbox.containers({}) == []
    bridge.close()


def test_progress_events_are_bounded_per_task(home, repo):
    lines = [f"line {i}" for i in range(50)]
    sandbox = FakeSandbox(lambda spec: Scripted(output=lines))
    bridge = fake_bridge(home, sandbox, max_progress_events=10)
    result = run(bridge, mock_task(repo, {}))
    progress = [
        e
        for e in bridge.task_logs(result.task_id, limit=1000).events
        if e.kind == "worker.progress"
    ]
    assert len(progress) == 11
    assert "beyond 10 events" in progress[-1].data["text"]
    bridge.close()


@pytest.mark.parametrize("stream_ends_after", [None, 12])
def test_the_summary_is_the_result_line_past_the_event_bound_and_a_stream_that_ended_early(
    home, repo, stream_ends_after
):
    lines = [f'{{"type": "progress", "message": "line {i}"}}' for i in range(50)]
    lines.append('{"type": "result", "summary": "the worker\'s own result"}')

    def behaviour(spec: ContainerSpec) -> Scripted | None:
        if role(spec) != "worker":
            return None
        return Scripted(output=lines, stream_ends_after=stream_ends_after)

    bridge = fake_bridge(home, FakeSandbox(behaviour), max_progress_events=10)
    result = run(bridge, mock_task(repo, {}))
    assert result.summary == "the worker's own result"
    notes = [
        e.data["text"]
        for e in bridge.task_logs(result.task_id, limit=1000).events
        if e.kind == "worker.progress"
    ]
    assert ("live output ended early" in notes[-1]) == (stream_ends_after is not None)
    bridge.close()


def test_a_missing_image_fails_at_once_naming_the_build_command(home, repo):
    sandbox = FakeSandbox(missing_images=["worker-bridge/mock:0.1.0"])
    bridge = fake_bridge(home, sandbox)
    result = run(bridge, mock_task(repo, {}))
    assert result.status == "failed"
    assert "images build mock" in result.error.message
    assert sandbox.started == []
    bridge.close()


def test_the_runner_uses_the_configuration_recorded_with_the_task(home, repo):
    creator = fake_bridge(home, output_tail_chars=100)
    task_id = creator.create_task(
        mock_task(repo, {"write": {"a": "a"}}, verify=["python3 -c 'print(\"x\" * 500)'"])
    ).task_id
    other = fake_bridge(home)  # another process, configured with the defaults
    assert other.config.output_tail_chars == 4000
    result = other.run_task(task_id)
    assert len(result.verification.commands[0].stdout_tail) <= 100
    assert result.status in TERMINAL
    creator.close()
    other.close()


def test_a_runner_whose_final_write_raises_still_leaves_the_task_terminal(fast, repo, monkeypatch):
    real = fast.store.transition

    def failing(task_id, target, **kwargs):
        if target == "succeeded":
            raise RuntimeError("database disk image is malformed")
        return real(task_id, target, **kwargs)

    monkeypatch.setattr(fast.store, "transition", failing)
    result = run(fast, mock_task(repo, {"write": {"a": "a"}}))
    assert result.status == "failed"
    assert result.error.kind == "internal"
    assert "could not be stored" in result.error.message
    assert "malformed" in result.error.message
