"""How a task ends: the outcome record, and the verdicts on a worker turn (recorded exit,
deadline, out of memory, exit status, protected paths, a file made binary) and on its
verification, each with one sentence a person can act on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from bridge.asking import approved_paths as paths_approved
from bridge.config.settings import LimitDefaults
from bridge.documents import WorkerExit
from bridge.models import Status, TaskSpec
from bridge.records import CommandResult, ErrorInfo, VerificationDoc
from bridge.store import Store
from bridge.workspace.diff import Change, protected_violations
from bridge.workspace.fs import display


class OutcomeFields(TypedDict, total=False):
    """The result fields an outcome writes on the task with its status."""

    verification: VerificationDoc


@dataclass
class Outcome:
    status: Status
    error: ErrorInfo | None = None
    fields: OutcomeFields = field(default_factory=lambda: OutcomeFields())


def error(kind: str, message: str) -> ErrorInfo:
    return ErrorInfo(kind=kind, message=message)


def timeout_error(limits: LimitDefaults, phase: str) -> ErrorInfo:
    return error(
        "timeout",
        f"The task passed its {limits.timeout_seconds} s deadline while {phase} "
        "(limits.timeout_seconds); raise the limit or narrow the task.",
    )


def judge_worker(
    exit_info: WorkerExit | None,
    changes: list[Change],
    spec: TaskSpec,
    limits: LimitDefaults,
    task_id: str,
    approved_paths: list[str] | None = None,
) -> Outcome | None:
    """The outcome that ends the task before verification, or None to go on and verify."""
    if exit_info is None:
        return Outcome(
            Status.FAILED,
            error("internal", "The worker's exit was not recorded; run the task again."),
        )
    if exit_info.over_limit:
        return Outcome(Status.FAILED, error("disk", exit_info.over_limit))
    if exit_info.timed_out:
        return Outcome(Status.TIMED_OUT, timeout_error(limits, "the worker was running"))
    last = exit_info.last_progress
    if exit_info.oom_killed:
        return Outcome(
            Status.FAILED,
            error(
                "out_of_memory",
                f"The worker ran out of memory (limit {limits.memory_mb} MB, limits.memory_mb; "
                f"exit status {exit_info.exit_code}"
                + (f"; last output: {last}" if last else "")
                + "); raise the limit or narrow the task.",
            ),
        )
    # The CLI said why it failed (a refused key, a rate limit...): that is the error. It only
    # explains a failed exit; any line of output could claim it, so it never fails a clean one.
    if exit_info.failure and exit_info.exit_code != 0:
        return Outcome(
            Status.FAILED,
            error(
                "worker_exit",
                exit_info.failure.rstrip(".")
                + f" (the worker exited with status {exit_info.exit_code}).",
            ),
        )
    if exit_info.exit_code != 0:
        return Outcome(
            Status.FAILED,
            error(
                "worker_exit",
                f"The worker exited with status {exit_info.exit_code}"
                + (f" (last output: {last})" if last else "")
                + f"; see `worker-bridge tasks logs {task_id}`.",
            ),
        )
    hits = protected_violations(changes, spec.verification.protected_paths, approved_paths or [])
    if hits:
        return Outcome(
            Status.FAILED,
            error(
                "protected_path",
                f"The worker changed protected path '{hits[0]}' (verification.protected_paths); "
                "the change was not verified.",
            ),
        )
    return None


def binary_refusal(made_binary: list[str], spec: TaskSpec, in_job: bool) -> Outcome | None:
    """The outcome of a change that made a file binary when the spec does not allow it
    (`verification.allow_binary`; unset, a job's tasks refuse it, since a ranking or a judge
    reads their changes, and a task of its own allows it, flagged for the caller)."""
    allowed = spec.verification.allow_binary
    if allowed is None:
        allowed = not in_job
    if allowed or not made_binary:
        return None
    why = "verification.allow_binary" + (" (false for a job's tasks)" if in_job else "")
    return Outcome(
        Status.FAILED,
        error(
            "binary_change",
            f"The worker's change makes '{display(made_binary[0])}' a binary file (a NUL byte "
            f"in its first 8000 bytes hides its text from the diff), which {why} refuses; the "
            "change was not verified.",
        ),
    )


def approved_paths(store: Store, task_id: str) -> list[str]:
    """The protected paths this task was allowed to change (its approved path requests)."""
    return paths_approved(store.requests.approved(task_id, "paths"))


def verification_failed(bad: CommandResult) -> ErrorInfo:
    if bad.status == "over_limit":
        return error("disk", bad.note or f"Verification command `{bad.command}` was stopped.")
    if bad.status == "not_run":
        return error("verification_failed", f"Verification command `{bad.command}` did not run.")
    if bad.status == "out_of_memory":
        return error(
            "verification_failed",
            f"Verification command `{bad.command}` ran out of memory (limits.memory_mb).",
        )
    return error(
        "verification_failed",
        f"Verification command `{bad.command}` exited with status {bad.exit_code}.",
    )


def repair_message(bad: CommandResult) -> str:
    """What a repair turn tells the worker: the failed command and the end of its output."""
    return (
        f"Verification failed: `{bad.command}` exited with status {bad.exit_code}.\n"
        f"stdout (end):\n{bad.stdout_tail}\nstderr (end):\n{bad.stderr_tail}\n"
        "Fix the cause so that the command succeeds."
    )


def repairs_taken(store: Store, task_id: str) -> int:
    """Repair turns since the task's last explicit turn (from the log, so a runner that resumes
    a task after a crash does not get a fresh budget), a turn run again after its cluster node
    was lost among them (the checks' node lost costs nothing)."""
    kinds = ("task.follow_up", "verification.auto_repair", "cluster.node_lost")
    taken = 0
    for event in store.events(task_id, limit=1_000_000, kinds=kinds):
        if event.kind == "task.follow_up":
            taken = 0
        elif event.kind != "cluster.node_lost" or not event.data.get("checks"):
            taken += 1
    return taken
