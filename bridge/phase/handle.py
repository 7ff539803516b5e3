"""The one small handle every phase receives: the task (id and record), the context it runs in,
the redactor, the event sink, the deadline and the cancellation check. Phases return results;
none of them imports the runner."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.config.settings import LimitDefaults
from bridge.events import EventData
from bridge.models import TERMINAL, TaskSpec
from bridge.phase.context import Context
from bridge.records import TaskRecord
from bridge.redact import Redactor


class Superseded(Exception):
    """The task stopped being this runner's (cancelled, or claimed by another runner)."""


class PipelineHooks:
    """Injected observation points, no-ops here: subclass to watch a run (tests use them to
    pause or kill a runner at a phase, or while a container runs)."""

    def phase_entered(self, handle: PhaseHandle, phase: str) -> None:
        """The runner recorded ``phase`` and is about to do its work."""

    def container_started(self, handle: PhaseHandle, role: str, container_id: str) -> None:
        """A task container of ``role`` (worker, verify) was started or adopted, its id
        recorded."""


@dataclass
class PhaseHandle:
    task_id: str
    record: TaskRecord
    ctx: Context
    redactor: Redactor
    deadline_at: float = 0.0
    lost: Callable[[], bool] = lambda: False  # the runner's claim was taken over
    # Whether the work is still wanted; by default, while the task has not ended (accept's
    # re-verification runs on a finished task, and says otherwise).
    wanted: Callable[[], bool] | None = None
    hooks: PipelineHooks | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def spec(self) -> TaskSpec:
        return self.record.spec

    @property
    def limits(self) -> LimitDefaults:
        return self.record.limits

    def emit(self, kind: str, data: EventData | None = None) -> None:
        """Store one event, redacted."""
        self.ctx.store.add_event(self.task_id, kind, self.redactor.redact_data(data or {}))

    def update(self, **fields: Any) -> None:
        """Write result fields of the task (never its status)."""
        self.ctx.store.update_task(self.task_id, **fields)

    def remaining(self) -> float:
        return self.deadline_at - time.time()

    def enter_phase(self, phase: str) -> None:
        """Persist the phase before doing its work, so a new runner resumes from it."""
        if not self.ctx.store.set_phase(self.task_id, phase):
            raise Superseded("not running")
        if self.hooks is not None:
            self.hooks.phase_entered(self, phase)

    def stopped(self) -> bool:
        """Whether the task stopped being this runner's: cancelled, finished, or taken over."""
        if self.lost():
            return True
        if self.wanted is not None:
            return not self.wanted()
        return self.ctx.store.status(self.task_id) in TERMINAL

    def ensure_active(self, kill: str | None = None) -> None:
        """Raise Superseded when the task was cancelled (removing ``kill``, a container just
        started, so a cancel racing its start cannot miss it)."""
        if self.stopped():
            if kill:
                self.ctx.sandbox.remove(kill)
            raise Superseded(self.ctx.store.status(self.task_id))

    def timed(self, key: str, started: float) -> None:
        self.timings[key] = round(time.monotonic() - started, 3)
