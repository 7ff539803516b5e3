"""Queueing a follow-up turn on a finished task: the message recorded, the status back to
`queued` (an explicit move out of a terminal status) and a detached runner launched, which
resumes the worker's own session on the same worktree, then collects and verifies again. Used
by the facade's `follow_up` and by a review job's coordinator."""

from __future__ import annotations

from bridge.errors import InvalidSpec, TaskStateError
from bridge.models import Status
from bridge.phase.context import Context
from bridge.pipeline.detached import launch_runner, reserve_runner
from bridge.pipeline.results import redactor_for
from bridge.records import TaskRecord


def queue_follow_up(ctx: Context, task_id: str, message: str, *, launch: bool = True) -> str:
    """Queue the next turn of a succeeded or failed task (TaskStateError when it is not one,
    its worktree was reclaimed, or it changed meanwhile). Returns the runner id it is reserved
    for; ``launch=False`` leaves starting that runner to the caller (one that waits for the
    turn runs it in its own process)."""
    if not message.strip():
        raise InvalidSpec("The follow-up message is empty; say what the worker should do.")
    task = ctx.store.load_task(task_id)
    if task.status not in (Status.SUCCEEDED, Status.FAILED):
        raise TaskStateError(
            f"Task {task_id} is {task.status}; only a succeeded or failed task takes a "
            "follow-up (delegate a new task instead)."
        )
    if task.worker_node is not None:
        raise TaskStateError(
            f"Task {task_id} ran on the cluster's node {task.worker_node}, which let go of its "
            "worktree when it ended; delegate a new task instead."
        )
    if task.pruned_at or not (ctx.config.home / "worktrees" / task_id).is_dir():
        raise TaskStateError(
            f"Task {task_id}'s worktree was reclaimed; delegate a new task instead."
        )
    runner_id = queue_turn(
        ctx, task, message, expect={Status.SUCCEEDED, Status.FAILED}, launch=launch
    )
    if runner_id is None:
        raise TaskStateError(f"Task {task_id} changed meanwhile; check it and try again.")
    return runner_id


def queue_turn(
    ctx: Context,
    task: TaskRecord,
    message: str,
    *,
    expect: set[Status],
    launch: bool = True,
    answered: list[str] | None = None,
) -> str | None:
    """Queue ``task``'s next turn with ``message``, from one of ``expect``: a runner reserved,
    the status back to `queued` (explicit) with the message recorded, and (``launch``) the
    runner started. ``answered``: the requests whose answers the message carries (a resume out
    of `waiting_input`), marked delivered with the turn. Returns the runner id; None when the
    task changed meanwhile (nothing done)."""
    store, task_id = ctx.store, task.task_id
    runner_id = reserve_runner(store, task_id, task.runner_id, finished_ok=True)
    follow_ups = [*task.follow_ups, message]
    turn = len(follow_ups)
    resumed = {"resumed": True} if answered is not None else {}
    if runner_id is None or not store.transition(
        task_id,
        Status.QUEUED,
        explicit=True,
        expect=expect,
        event={"turn": turn, **resumed},
        turn=turn,
        follow_ups=follow_ups,
        phase=None,
        error=None,
        verification=None,
        held_outcome=None,
        finished_at=None,
    ):
        return None
    if answered:
        store.requests.mark_delivered(answered, turn)
    shown = {"turn": turn, "message": redactor_for(task).redact(message)}
    store.add_event(task_id, "task.follow_up", {**shown, **({"answers": True} if resumed else {})})
    if launch:
        launch_runner(ctx.config, task_id, runner_id)
    return runner_id
