"""How a task ends: the outcome record, and the verdict on a worker turn before verification
(recorded exit, deadline, out of memory, exit status, protected paths), each with one sentence
a person can act on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge.models import Status, TaskSpec
from bridge.workspace.changes import Change, protected_violations

if TYPE_CHECKING:
    from bridge.pipeline.worker_run import WorkerExit


@dataclass
class Outcome:
    status: Status
    error: dict[str, str] | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def error(kind: str, message: str) -> dict[str, str]:
    return {"kind": kind, "message": message}


def timeout_error(limits: dict[str, Any], phase: str) -> dict[str, str]:
    return error(
        "timeout",
        f"The task passed its {limits['timeout_seconds']} s deadline while {phase} "
        "(limits.timeout_seconds); raise the limit or narrow the task.",
    )


def judge_worker(
    exit_info: WorkerExit | None,
    changes: list[Change],
    spec: TaskSpec,
    limits: dict[str, Any],
    task_id: str,
) -> Outcome | None:
    """The outcome that ends the task before verification, or None to go on and verify."""
    if exit_info is None:
        return Outcome(
            Status.FAILED,
            error("internal", "The worker's exit was not recorded; run the task again."),
        )
    if exit_info.timed_out:
        return Outcome(Status.TIMED_OUT, timeout_error(limits, "the worker was running"))
    last = exit_info.last_progress
    if exit_info.oom_killed:
        return Outcome(
            Status.FAILED,
            error(
                "out_of_memory",
                f"The worker ran out of memory (limit {limits['memory_mb']} MB, limits.memory_mb; "
                f"exit status {exit_info.exit_code}"
                + (f"; last output: {last}" if last else "")
                + "); raise the limit or narrow the task.",
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
    hits = protected_violations(changes, spec.verification.protected_paths)
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
