"""The job result (bridge/records.py's JobResult) from a job's row and its tasks, and the
choice of which candidate `accept_job` takes."""

from __future__ import annotations

from collections.abc import Sequence

from bridge.documents import JobSummary
from bridge.errors import InvalidSpec, TaskStateError
from bridge.models import JobStatus, Status
from bridge.records import JobRecord, JobResult, JobTask, TaskRecord


def job_result(job: JobRecord, tasks: list[TaskRecord]) -> JobResult:
    result = job.result
    candidates = result.get("candidates", [])
    return JobResult(
        job_id=job.job_id,
        kind=job.kind,
        status=job.status,
        repository=job.repository,
        objective=job.spec.get("task", {}).get("objective", ""),
        stopped=result.get("stopped"),
        tasks=[
            JobTask(
                task_id=t.task_id,
                role=t.job_role or "",
                label=t.job_label,
                worker=t.worker,
                status=t.status,
                phase=t.phase,
            )
            for t in tasks
        ],
        candidates=candidates,
        ordering=result.get("ordering", {}),
        winner=result.get("winner"),
        rounds=result.get("rounds") or result.get("steps") or [],
        summary=JobSummary(
            candidates=len(candidates),
            eligible=sum(1 for c in candidates if c.get("eligible")),
            judge=judge.get("problem") if (judge := result.get("judge")) else None,
        ),
        skipped=[*job.spec.get("skipped", []), *result.get("skipped", [])],
        error=job.error,
        created_at=job.created_at,
        finished_at=job.finished_at,
    )


def chosen_candidate(job: JobRecord, task_id: str | None) -> str:
    """The candidate `accept_job` takes: the one named, or the winner (one sentence each for a
    job still running, one with no eligible candidate, an unresolved one without a choice, and
    a task that is not an eligible candidate of the job)."""
    if job.status in (JobStatus.CREATED, JobStatus.RUNNING):
        raise TaskStateError(f"Job {job.job_id} is still {job.status}; wait for it to end.")
    if job.status == JobStatus.ACCEPTED:
        raise TaskStateError(f"Job {job.job_id} was already accepted.")
    if job.status == JobStatus.CANCELLED:
        raise TaskStateError(f"Job {job.job_id} was cancelled; nothing of it can be accepted.")
    if job.kind in ("fanout",):
        raise TaskStateError(
            f"Job {job.job_id} is a fanout; accept its tasks with `tasks accept`, or integrate "
            "them with `jobs integrate` and accept that job."
        )
    if job.kind == "integrate":
        winner = job.result.get("winner")
        if winner is None:
            raise TaskStateError(f"Job {job.job_id} integrated nothing that passed its checks.")
        if task_id not in (None, winner):
            raise InvalidSpec(f"Task {task_id} is not the integration of job {job.job_id}.")
        return winner
    if job.kind == "review":
        implementer = job.result.get("implementer")
        if task_id not in (None, implementer):
            raise InvalidSpec(f"Task {task_id} is not the implementer of job {job.job_id}.")
        if job.status != JobStatus.SUCCEEDED or implementer is None:
            raise TaskStateError(f"Job {job.job_id} {job.status}; its change cannot be accepted.")
        return implementer
    candidates = {c["task_id"]: c for c in job.result.get("candidates", [])}
    if not any(c.get("eligible") for c in candidates.values()):
        raise TaskStateError(
            f"Job {job.job_id} has no eligible candidate (none passed our verification); "
            "accept a task of it with `tasks accept` if you must."
        )
    if task_id is None:
        winner = job.result.get("winner")
        if job.status == JobStatus.UNRESOLVED or winner is None:
            ordering = ", ".join(job.result.get("ordering", {}).get("deterministic", []))
            raise TaskStateError(
                f"Job {job.job_id} is unresolved (the judge failed or disagreed with itself); "
                f"choose a candidate with --task (by verification: {ordering})."
            )
        return winner
    if task_id not in candidates:
        raise InvalidSpec(f"Task {task_id} is not a candidate of job {job.job_id}.")
    if not candidates[task_id].get("eligible"):
        raise TaskStateError(
            f"Task {task_id} is not eligible ({'; '.join(candidates[task_id]['reasons'])}); "
            "only a candidate that passed our verification is accepted through its job."
        )
    return task_id


READ_ONLY_ROLES = ("judge", "reviewer")  # their tasks change nothing, accepted or not


def still_as_ended(
    job: JobRecord, chosen: TaskRecord, others: list[TaskRecord], sources: Sequence[TaskRecord] = ()
) -> None:
    """Refuse (one sentence) to accept ``chosen`` through ``job`` when a task of the job (or
    one of the ``sources`` an integration merged) was already accepted outside it (a second
    change would reach the user's tree), or when
    ``chosen`` changed (a follow-up turn) after the job ranked or reviewed it."""
    for other in others:
        if other.status == Status.ACCEPTED and other.job_role not in READ_ONLY_ROLES:
            raise TaskStateError(
                f"Task {other.task_id} of job {job.job_id} was already accepted (with `tasks "
                "accept`); the job accepts no second change."
            )
    for source in sources:
        if source.status == Status.ACCEPTED:
            raise TaskStateError(
                f"Task {source.task_id}, integrated by job {job.job_id}, was already accepted "
                "alone; the integration would write its change a second time."
            )
    ranked = {c["task_id"]: c for c in job.result.get("candidates", [])}.get(chosen.task_id)
    rounds = job.result.get("rounds")
    reviewed = rounds[-1].get("implementer_turn") if rounds else None
    if ranked is not None and ranked.get("snapshot_commit") not in (None, chosen.snapshot_commit):
        changed = "its snapshot is not the one ranked"
    elif job.kind == "review" and reviewed is not None and reviewed != chosen.turn:
        changed = f"it is at turn {chosen.turn}, the last review read turn {reviewed}"
    else:
        return
    raise TaskStateError(
        f"Task {chosen.task_id} changed after job {job.job_id} ranked it ({changed}, a "
        "follow-up?); accept it with `tasks accept` if you want this change, or run a new job."
    )
