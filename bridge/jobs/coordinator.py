"""The coordinator of a job: the one process that advances it, owning the job the way a runner
owns a task (a claim renewed by a heartbeat; `Runners(store, JOBS)`).

It makes the job's tasks with idempotency keys derived from the job id and slot, so a
coordinator resumed after a crash finds the tasks the first one made instead of making new
ones; it starts each as an ordinary task in its own detached runner, so the host, worker and
repository limits hold for them exactly as for any task; and it stops, cancelling every task of
the job, once the job is cancelled."""

from __future__ import annotations

import time
from collections.abc import Callable

from bridge.documents import ErrorDoc, JobFindings, Skipped
from bridge.errors import CircuitOpen
from bridge.models import TERMINAL, JobStatus, JsonObject, Status
from bridge.phase.context import Context
from bridge.pipeline.answer import expire_due
from bridge.pipeline.cancel import cancel_task
from bridge.pipeline.creation import new_task_row, record_task
from bridge.pipeline.detached import spawn_runner
from bridge.pipeline.scheduling import HEARTBEAT_EVERY, LEASE_TTL
from bridge.records import JobRecord, TaskRecord
from bridge.scope import RepositoryScope
from bridge.store.owners import Owner

POLL_SECONDS = 0.2  # a store read per poll: cheap, and the job ends at most this late


class JobStopped(Exception):
    """The job was cancelled, or this coordinator no longer owns it: stop advancing it."""


class SlotTaken(Exception):
    """A task outside the job holds one of the job's idempotency keys (anyone who can make
    tasks can learn a job id): the job must not take that task as its own."""


class JobCoordinator:
    """Advances one job; `run()` returns when the job has ended or is no longer ours."""

    def __init__(self, ctx: Context, job_id: str, owner: Owner, poll: float = POLL_SECONDS):
        self.ctx = ctx
        self.store = ctx.store
        self.job_id = job_id
        self.owner = owner
        self.poll = poll
        self._beat = 0.0

    def job(self) -> JobRecord:
        return self.store.jobs.record(self.job_id)

    def run(self, body: Callable[[JobCoordinator], None]) -> None:
        """Claim the job and advance it with ``body`` (its kind's steps, e.g. run_compete)."""
        if not self.store.job_runners.claim(self.job_id, self.owner, LEASE_TTL):
            return
        self._beat = time.monotonic()
        try:
            body(self)
        except JobStopped:
            pass
        except SlotTaken as taken:
            self.finish(
                JobStatus.FAILED, self.job().result, ErrorDoc(kind="slot_taken", message=str(taken))
            )
        except CircuitOpen as refused:  # a task the job cannot do without (an implementer...)
            self.finish(
                JobStatus.FAILED,
                self.job().result,
                ErrorDoc(kind="circuit_open", message=refused.message),
            )
        except Exception as exc:  # the job must end, not stay `running` with no coordinator
            self.finish(
                JobStatus.FAILED,
                self.job().result,
                ErrorDoc(kind="internal", message=f"The job's coordinator failed: {exc!r}."),
            )
            raise
        finally:
            self.store.job_runners.release(self.job_id, self.owner)

    # -- staying in charge -----------------------------------------------------------------

    def alive(self) -> None:
        """Renew the claim; JobStopped when the job was cancelled (every task of it is then
        cancelled, including any made after the canceller listed them) or is no longer ours."""
        if self.job().status == JobStatus.CANCELLED:
            for task_id in self.store.jobs.task_ids(self.job_id):
                cancel_task(self.ctx, task_id, "The task's job was cancelled.")
            raise JobStopped
        if time.monotonic() - self._beat >= HEARTBEAT_EVERY:
            if not self.store.job_runners.heartbeat(self.job_id, self.owner, LEASE_TTL):
                raise JobStopped
            self._beat = time.monotonic()

    # -- its tasks ---------------------------------------------------------------------------

    def ensure_task(self, spec: JsonObject, role: str, label: str) -> str:
        """The slot's task: made now, or found by its idempotency key when an earlier
        coordinator of this job made it."""
        job = self.job()
        config = job.config
        scope = RepositoryScope.of(config.repositories)
        made, event = new_task_row(config, self.ctx.sandbox, scope, spec)
        made = made.model_copy(update={"job_id": self.job_id, "job_role": role, "job_label": label})
        event["job_id"] = self.job_id
        task_id, created = record_task(self.store, config, made, event)
        found = self.store.load_task(task_id)
        if (found.job_id, found.job_label) != (self.job_id, label):
            raise SlotTaken(
                f"Task {task_id}, made outside job {self.job_id}, holds the idempotency key "
                f"{made.spec.idempotency_key} of the job's slot {label}; the job stopped rather "
                "than take it as its own."
            )
        if created:
            self.store.add_event(
                self.job_id,
                "job.candidate" if role == "candidate" else f"job.{role}",
                {"task_id": task_id, "role": role, "label": label, "worker": spec["worker"]},
            )
        return task_id

    def skip(self, label: str, worker: str, role: str, refused: CircuitOpen) -> Skipped:
        """Record that the slot's task was refused by its worker's circuit breaker (a
        `job.skipped` event); the entry for the result's `skipped`."""
        entry = Skipped(label=label, worker=worker, role=role, reason=refused.message)
        self.store.add_event(self.job_id, "job.skipped", entry)
        return entry

    def start(self, task_id: str) -> None:
        """Start a `created` task in its own detached runner (an ordinary task: it waits for
        its leases like any other); a started one is left to its runner."""
        record = self.store.load_task(task_id)
        if record.status != Status.CREATED:
            return
        if spawn_runner(self.job().config, self.store, task_id, replacing=record.runner_id):
            self.store.transition(task_id, Status.QUEUED, expect={Status.CREATED})

    def _recover(self, task_ids: list[str]) -> None:
        """Tasks of ours whose runner died get a new one (as `WorkerBridge.recover` would)."""
        wanted = set(task_ids)
        expire_due(self.ctx)  # a task of ours waiting for input past its timeout ends
        for row in self.store.runners.stranded():
            if row["task_id"] in wanted:
                spawn_runner(self.job().config, self.store, row["task_id"], row["runner_id"])

    def wait_all(self, task_ids: list[str]) -> list[TaskRecord]:
        """Block until every task has ended; their records in the order given."""
        while True:
            self.alive()
            statuses = self.store.statuses(task_ids)
            if all(Status(statuses[t]) in TERMINAL for t in task_ids):
                return [self.store.load_task(t) for t in task_ids]
            for task_id in task_ids:
                if statuses[task_id] == Status.CREATED:
                    self.start(task_id)
            self._recover(task_ids)
            time.sleep(self.poll)

    # -- its end -----------------------------------------------------------------------------

    def finish(self, status: JobStatus, result: JobFindings, error: ErrorDoc | None = None) -> None:
        if self.store.jobs.transition(
            self.job_id, status, {JobStatus.RUNNING}, result=result, error=error
        ):
            self.store.add_event(
                self.job_id,
                "job.finished",
                {"status": str(status), "winner": result.get("winner"), "error": error},
            )
