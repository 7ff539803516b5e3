"""The facade's verbs on jobs: `JobVerbs`, which WorkerBridge (bridge/service/facade.py) holds
and calls, using its store, sandbox, scope and task verbs. A job outside the bridge's scope is
absent for every verb, as a task is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from bridge.errors import JobNotFound
from bridge.jobs.results import job_result
from bridge.models import JOB_TERMINAL, JobStatus, TaskSpec
from bridge.records import AcceptResult, JobRecord, JobResult, TaskRecord, TaskResult

# What makes, launches, cancels or accepts a job is imported in the verb that does it: reading
# a job (`jobs show`, `jobs list`) loads none of it.
if TYPE_CHECKING:
    from bridge.config.settings import Config
    from bridge.events import JobCreated
    from bridge.phase.context import Context
    from bridge.sandbox import Sandbox
    from bridge.scope import RepositoryScope
    from bridge.store import Store
    from bridge.store.jobs import NewJob


class Tasks(Protocol):
    """What the job verbs use of the facade (WorkerBridge): its configuration, store, sandbox
    and scope, and its task verbs, so a job's tasks get every check a task gets."""

    config: Config

    @property
    def store(self) -> Store: ...

    @property
    def sandbox(self) -> Sandbox: ...

    @property
    def scope(self) -> RepositoryScope: ...

    def context(self) -> Context: ...

    def _task(self, task_id: str) -> TaskRecord: ...

    def accept_task(
        self, task_id: str, *, allow_unverified: bool = False, reverify: bool = True
    ) -> AcceptResult: ...

    def reject_task(self, task_id: str, reason: str = "") -> TaskResult: ...


class JobVerbs:
    """The verbs on jobs behind WorkerBridge's (which carries their documentation): compete,
    review, fanout, integrate, job_status, list_jobs, cancel_job, accept_job. A job's tasks are
    made, accepted and rejected through the facade's own task verbs, so each gets every check
    a task gets."""

    def __init__(self, bridge: Tasks) -> None:
        self.bridge = bridge

    def job_record(self, job_id: str) -> JobRecord:
        """The job's record; JobNotFound for an unknown id and one outside the scope alike."""
        job = self.bridge.store.jobs.record(job_id)
        if not self.bridge.scope.allows(job.repository):
            raise JobNotFound.of(job_id)
        return job

    def compete(
        self,
        task: dict[str, Any] | TaskSpec,
        workers: list[str],
        *,
        attempts: int = 1,
        judge: str | None = None,
    ) -> JobResult:
        from bridge.jobs.creation import new_compete_row

        bridge = self.bridge
        made = new_compete_row(
            bridge.config, bridge.sandbox, bridge.scope, task, workers, attempts, judge
        )
        return self._launch(*made)

    def review(
        self,
        task: dict[str, Any] | TaskSpec,
        worker: str,
        reviewer: str,
        *,
        rounds: int = 3,
    ) -> JobResult:
        from bridge.jobs.creation import new_review_row

        bridge = self.bridge
        made = new_review_row(
            bridge.config, bridge.sandbox, bridge.scope, task, worker, reviewer, rounds
        )
        return self._launch(*made)

    def fanout(self, task: dict[str, Any] | TaskSpec, objectives: list[str]) -> JobResult:
        from bridge.jobs.creation import new_fanout_row

        row, event = new_fanout_row(
            self.bridge.config, self.bridge.sandbox, self.bridge.scope, task, objectives
        )
        return self._launch(row, event)

    def integrate(self, job_id: str, task_ids: list[str]) -> JobResult:
        self.job_record(job_id)
        tasks = [self.bridge._task(t) for t in task_ids]
        from bridge.jobs.creation import new_integrate_row

        row, event = new_integrate_row(self.bridge.config, self.bridge.sandbox, job_id, tasks)
        return self._launch(row, event)

    def _launch(self, job: NewJob, event: JobCreated) -> JobResult:
        from bridge.jobs.detached import spawn_coordinator

        self.bridge.store.jobs.insert(job, event)
        spawn_coordinator(self.bridge.config, self.bridge.store, job["job_id"], replacing=None)
        return self.job_status(job["job_id"])

    def job_status(self, job_id: str) -> JobResult:
        return job_result(self.job_record(job_id), self._tasks_of(job_id))

    def _tasks_of(self, job_id: str) -> list[TaskRecord]:
        store = self.bridge.store
        return [store.load_task(t) for t in store.jobs.task_ids(job_id)]

    def list_jobs(self, limit: int | None = None) -> list[JobResult]:
        return [
            self.job_status(job.job_id)
            for job in self.bridge.store.jobs.records(limit)
            if self.bridge.scope.allows(job.repository)
        ]

    def cancel_job(self, job_id: str) -> JobResult:
        job = self.job_record(job_id)
        if job.status not in JOB_TERMINAL and self.bridge.store.jobs.transition(
            job_id,
            JobStatus.CANCELLED,
            {JobStatus.CREATED, JobStatus.RUNNING},
            error={"kind": "cancelled", "message": "The job was cancelled."},
        ):
            self.bridge.store.add_event(job_id, "job.finished", {"status": "cancelled"})
        from bridge.pipeline.cancel import cancel_task

        for task_id in self.bridge.store.jobs.task_ids(job_id):
            cancel_task(self.bridge.context(), task_id, "The task's job was cancelled.")
        return self.job_status(job_id)

    def accept_job(
        self, job_id: str, task_id: str | None = None, *, reverify: bool = True
    ) -> AcceptResult:
        from bridge.jobs.results import chosen_candidate, still_as_ended
        from bridge.workspace.locks import job_lock

        self.job_record(job_id)  # absent (outside the scope) before any lock file is made
        with job_lock(self.bridge.config.home, job_id):  # two accepts of one job: one at a time
            job = self.job_record(job_id)
            chosen = chosen_candidate(job, task_id)
            tasks = self._tasks_of(job_id)
            record = next((t for t in tasks if t.task_id == chosen), None)
            record = record or self.bridge._task(chosen)
            sources = [self.bridge.store.load_task(t) for t in job.spec.get("tasks", [])]
            still_as_ended(job, record, [t for t in tasks if t.task_id != chosen], sources)
            outcome = self.bridge.accept_task(chosen, reverify=reverify)
            if not outcome.accepted:
                return outcome
            for other in job.result.get("candidates", []):  # a review job has none
                if other["task_id"] != chosen:
                    self.bridge.reject_task(other["task_id"], f"job {job_id} accepted {chosen}")
            if self.bridge.store.jobs.transition(
                job_id,
                JobStatus.ACCEPTED,
                {JobStatus.SUCCEEDED, JobStatus.UNRESOLVED, JobStatus.FAILED},
            ):
                self.bridge.store.add_event(job_id, "job.accepted", {"task_id": chosen})
            return outcome
