"""Cancelling a task from any process: the status becomes `cancelled` (final), then the task's
containers are killed with everything in them. Used by the facade and by a job's coordinator
(cancelling a job cancels every task of it)."""

from __future__ import annotations

from bridge.errors import BridgeError
from bridge.models import TERMINAL, Status
from bridge.phase.context import Context
from bridge.store.db import now_iso


def cancel_task(ctx: Context, task_id: str, message: str = "The task was cancelled.") -> None:
    """Cancel ``task_id`` unless it is finished; its containers are removed either way."""
    status, phase = ctx.store.status_and_phase(task_id)
    if status not in TERMINAL and ctx.store.transition(
        task_id,
        Status.CANCELLED,
        error={"kind": "cancelled", "message": message},
        finished_at=now_iso(),
        phase=None,
    ):
        ctx.store.add_event(task_id, "task.cancelled", {"phase": phase})
        ctx.store.requests.close_pending(task_id, "the task was cancelled")
    try:
        ctx.sandbox.remove_by_labels({"io.worker-bridge.task": task_id})
    except BridgeError:
        pass  # no engine: nothing of this task can be running in it
