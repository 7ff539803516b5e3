"""The facade's verbs on jobs, mixed into WorkerBridge (bridge/service/facade.py), which provides
the store, the sandbox, the scope and the task verbs they use. A job outside the bridge's scope is
absent for every verb, as a task is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge.config.profiles import without_filled
from bridge.errors import InvalidSpec, JobNotFound
from bridge.jobs.results import job_result
from bridge.models import JOB_TERMINAL, JobStatus, Status, TaskSpec
from bridge.records import AcceptResult, JobRecord, JobResult, TaskRecord, TaskResult

# What makes, launches, cancels or accepts a job is imported in the verb that does it: reading
# a job (`jobs show`, `jobs list`) loads none of it.
if TYPE_CHECKING:
    from bridge.config.settings import Config
    from bridge.phase.context import Context
    from bridge.sandbox import Sandbox
    from bridge.scope import RepositoryScope
    from bridge.store import Store


class JobVerbs:
    """compete, job_status, list_jobs, cancel_job, accept_job and retry_task."""

    config: Config
    store: Store
    sandbox: Sandbox
    scope: RepositoryScope

    def context(self) -> Context: ...  # provided by WorkerBridge

    def _task(self, task_id: str) -> TaskRecord: ...

    def get_task(self, task_id: str) -> TaskResult: ...

    def create_task(self, spec: dict[str, Any] | TaskSpec) -> TaskResult: ...

    def reject_task(self, task_id: str, reason: str = "") -> TaskResult: ...

    def accept_task(
        self, task_id: str, *, allow_unverified: bool = False, reverify: bool = True
    ) -> AcceptResult: ...

    def _job(self, job_id: str) -> JobRecord:
        """The job's record; JobNotFound for an unknown id and one outside the scope alike."""
        job = JobRecord.model_validate(self.store.jobs.load(job_id))
        if not self.scope.allows(job.repository):
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
        """One objective on several candidates (each worker ``attempts`` times), each its own
        task from the same base, run by a detached coordinator; returns the job at once. Its
        result ranks the candidates by our verification, then the tie-breaks, then the judge."""
        from bridge.jobs.creation import new_compete_row
        from bridge.jobs.detached import spawn_coordinator

        row, event = new_compete_row(
            self.config, self.sandbox, self.scope, task, workers, attempts, judge
        )
        self.store.jobs.insert(row, event)
        spawn_coordinator(self.config, self.store, row["job_id"], replacing=None)
        return self.job_status(row["job_id"])

    def review(
        self,
        task: dict[str, Any] | TaskSpec,
        worker: str,
        reviewer: str,
        *,
        rounds: int = 3,
    ) -> JobResult:
        """An implementer task by ``worker``, then ``reviewer`` reviewing its verified snapshot
        read-only; requested changes become follow-up turns in the implementer's own session,
        up to ``rounds`` reviews. Returns the job at once (a detached coordinator runs it)."""
        from bridge.jobs.creation import new_review_row
        from bridge.jobs.detached import spawn_coordinator

        row, event = new_review_row(
            self.config, self.sandbox, self.scope, task, worker, reviewer, rounds
        )
        self.store.jobs.insert(row, event)
        spawn_coordinator(self.config, self.store, row["job_id"], replacing=None)
        return self.job_status(row["job_id"])

    def fanout(self, task: dict[str, Any] | TaskSpec, objectives: list[str]) -> JobResult:
        """Several objectives on one base, one task each, run in parallel within the limits;
        returns the job at once. Integrate the ones you want with `integrate`."""
        from bridge.jobs.creation import new_fanout_row

        row, event = new_fanout_row(self.config, self.sandbox, self.scope, task, objectives)
        return self._launch(row, event)

    def integrate(self, job_id: str, task_ids: list[str]) -> JobResult:
        """Apply the chosen verified tasks of a job one after another onto the common base,
        verifying after each; stops at the first conflict or failure, naming it. The last
        verified step is a task the caller accepts (`accept_job` on the new job)."""
        self._job(job_id)
        tasks = [self._task(t) for t in task_ids]
        from bridge.jobs.creation import new_integrate_row

        row, event = new_integrate_row(self.config, self.sandbox, job_id, tasks)
        return self._launch(row, event)

    def _launch(self, row: dict[str, Any], event: dict[str, Any]) -> JobResult:
        from bridge.jobs.detached import spawn_coordinator

        self.store.jobs.insert(row, event)
        spawn_coordinator(self.config, self.store, row["job_id"], replacing=None)
        return self.job_status(row["job_id"])

    def job_status(self, job_id: str) -> JobResult:
        job = self._job(job_id)
        tasks = [self.store.load_task(t) for t in self.store.jobs.task_ids(job_id)]
        return job_result(job, tasks)

    def list_jobs(self, limit: int | None = None) -> list[JobResult]:
        return [
            self.job_status(row["job_id"])
            for row in self.store.jobs.list(limit)
            if self.scope.allows(row["repository"])
        ]

    def cancel_job(self, job_id: str) -> JobResult:
        """Cancel the job and every task of it (its coordinator cancels any it makes after)."""
        job = self._job(job_id)
        if job.status not in JOB_TERMINAL and self.store.jobs.transition(
            job_id,
            JobStatus.CANCELLED,
            {JobStatus.CREATED, JobStatus.RUNNING},
            error={"kind": "cancelled", "message": "The job was cancelled."},
        ):
            self.store.add_event(job_id, "job.finished", {"status": "cancelled"})
        from bridge.pipeline.cancel import cancel_task

        for task_id in self.store.jobs.task_ids(job_id):
            cancel_task(self.context(), task_id, "The task's job was cancelled.")
        return self.job_status(job_id)

    def accept_job(
        self, job_id: str, task_id: str | None = None, *, reverify: bool = True
    ) -> AcceptResult:
        """Accept the job's best candidate (or the one named) through the usual accept, then
        mark the other candidates `rejected`. One sentence when there is nothing to accept."""
        from bridge.jobs.results import chosen_candidate, still_as_ended
        from bridge.workspace.locks import job_lock

        self._job(job_id)  # absent (outside the scope) before any lock file is made
        with job_lock(self.config.home, job_id):  # two accepts of one job: one at a time
            job = self._job(job_id)
            chosen = chosen_candidate(job, task_id)
            tasks = [self.store.load_task(t) for t in self.store.jobs.task_ids(job_id)]
            record = next((t for t in tasks if t.task_id == chosen), None) or self._task(chosen)
            sources = [self.store.load_task(t) for t in job.spec.get("tasks", [])]
            still_as_ended(job, record, [t for t in tasks if t.task_id != chosen], sources)
            outcome = self.accept_task(chosen, reverify=reverify)
            if not outcome.accepted:
                return outcome
            for other in job.result.get("candidates", []):  # a review job has none
                if other["task_id"] != chosen:
                    self.reject_task(other["task_id"], f"job {job_id} accepted {chosen}")
            if self.store.jobs.transition(
                job_id,
                JobStatus.ACCEPTED,
                {JobStatus.SUCCEEDED, JobStatus.UNRESOLVED, JobStatus.FAILED},
            ):
                self.store.add_event(job_id, "job.accepted", {"task_id": chosen})
            return outcome

    def retry_task(self, task_id: str) -> TaskResult:
        """A new task from the same spec (a fresh worktree from the same base), linked to the
        first (`metadata.retry_of`); returns it `created`, for `start_detached` or `run_task`."""
        record = self._task(task_id)
        if record.status not in (
            Status.SUCCEEDED,
            Status.FAILED,
            Status.CANCELLED,
            Status.TIMED_OUT,
            Status.REJECTED,
        ):
            raise InvalidSpec(f"Task {task_id} is {record.status}; retry a task once it has ended.")
        spec = without_filled(record.spec_doc, record.profile)  # filled again, as it is now
        spec["idempotency_key"] = None
        spec["metadata"] = {**(spec.get("metadata") or {}), "retry_of": task_id}
        retried = self.create_task(spec)
        self.store.add_event(task_id, "task.retried", {"task_id": retried.task_id})
        return retried
