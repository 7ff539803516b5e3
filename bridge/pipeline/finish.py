"""Finish: the task's terminal status, with its result fields, timings and redacted error, in one
compare-and-set. If writing the outcome itself fails, the task still ends: `failed`, `internal`,
with the reason (a runner never leaves a task without a terminal status). The worker's circuit
breaker then learns how it ended (bridge/workers/circuit.py's record_task_outcome, by the `circuit`
section recorded with the task, like everything its runner does)."""

from __future__ import annotations

from bridge.models import Status
from bridge.phase.handle import PhaseHandle
from bridge.pipeline.outcomes import Outcome, error
from bridge.records import ErrorInfo
from bridge.store import Store
from bridge.store.db import now_iso
from bridge.workers.circuit import record_task_outcome


def finish_task(handle: PhaseHandle, outcome: Outcome) -> None:
    err = handle.redactor.redact_data(outcome.error.model_dump()) if outcome.error else None
    try:
        ended = handle.ctx.store.transition(
            handle.task_id,
            outcome.status,
            event={"error": err} if err else {},
            **outcome.fields,
            timings=handle.timings,
            finished_at=now_iso(),
            phase=None,
            error=err,
        )
    except Exception as exc:
        _fail_internal(handle.ctx.store, handle.task_id, f"its outcome could not be stored ({exc})")
        return
    if ended:  # its bookkeeping failing never undoes the outcome (a `circuit.unrecorded` event)
        record_task_outcome(handle.ctx.store, handle.ctx.config, handle.task_id)


def fail_unreadable(store: Store, task_id: str, exc: Exception) -> None:
    _fail_internal(store, task_id, f"its record could not be read ({exc})")


def _fail_internal(store: Store, task_id: str, why: str) -> None:
    reason: ErrorInfo = error(
        "internal",
        f"worker-bridge could not finish task {task_id}: {why[:300]}; run it again.",
    )
    store.transition(
        task_id,
        Status.FAILED,
        event={"error": reason.model_dump()},
        error=reason,
        finished_at=now_iso(),
        phase=None,
    )
