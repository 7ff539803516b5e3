"""A review job: an implementer task, then a read-only reviewer task on the implementer's
verified snapshot, answering a verdict with findings. `changes_requested` becomes a follow-up
turn in the implementer's own session (its worktree and the worker's session kept), verified
again, then reviewed again; the job stops on `approve`, on a round with no new findings, or at
the round limit, and every round is in its result.

Resumable: the reviewer of round N has the idempotency key `<job>:review-N`, and the follow-up
after round N is queued only while the implementer's task is still before turn N."""

from __future__ import annotations

from bridge.documents import Finding, JobFindings, ReviewRound
from bridge.jobs.compete import read_diff, shown_diff
from bridge.jobs.coordinator import JobCoordinator
from bridge.jobs.review_answer import follow_up_message, parse_review, review_prompt
from bridge.jobs.slots import implementer_spec, reviewer_spec
from bridge.models import JobStatus, Status
from bridge.pipeline.follow_up import queue_follow_up
from bridge.records import JobRecord, TaskRecord


def _key(finding: Finding) -> tuple[str | None, int | None, str]:
    return (finding["path"], finding["line"], finding["text"].strip().lower())


def _review_round(
    co: JobCoordinator, job: JobRecord, impl: str, record: TaskRecord, round_no: int
) -> ReviewRound:
    """One review of the implementer's verified snapshot: the reviewer's task run read-only on
    the quoted diff, its answer parsed (its new findings counted by the caller)."""
    bounds = job.config.jobs
    diff, total = read_diff(shown_diff(co.store.artifacts(impl)), bounds.quoted_diff_chars)
    prompt = review_prompt(job.spec["task"]["objective"], diff, total, bounds)
    spec = reviewer_spec(job.spec, job.job_id, round_no, record.snapshot_commit or "", prompt)
    reviewer = co.ensure_task(spec, "reviewer", f"review-{round_no}")
    co.start(reviewer)
    (review,) = co.wait_all([reviewer])
    if review.status == Status.SUCCEEDED:
        verdict, findings, problem = parse_review(review.summary, bounds, diff)
    else:
        why = review.error.message if review.error else f"it ended {review.status}"
        verdict, findings, problem = None, [], f"the reviewer's task did not succeed: {why}"
    return ReviewRound(
        round=round_no,
        implementer_turn=record.turn,
        verification_ok=record.verification.ok if record.verification else None,
        changed_files=[f.path for f in record.changed_files],
        reviewer_task=reviewer,
        verdict=verdict,
        findings=findings,
        new_findings=0,
        problem=problem or None,
    )


def run_review(co: JobCoordinator) -> None:
    job = co.job()
    impl = co.ensure_task(implementer_spec(job.spec, job.job_id), "implementer", "implementer")
    co.start(impl)
    rounds: list[ReviewRound] = []
    result = JobFindings(implementer=impl, rounds=rounds, stopped=None)
    seen: set[tuple[str | None, int | None, str]] = set()
    for round_no in range(1, job.spec["rounds"] + 1):
        (record,) = co.wait_all([impl])
        if record.status != Status.SUCCEEDED:
            why = record.error.message if record.error else f"it ended {record.status}"
            result["stopped"] = "the implementer's task did not succeed"
            co.finish(
                JobStatus.FAILED,
                result,
                {"kind": "implementer", "message": f"The implementer's task failed: {why}"},
            )
            return
        entry = _review_round(co, job, impl, record, round_no)
        findings, problem, verdict = entry["findings"], entry["problem"], entry["verdict"]
        new = [f for f in findings if _key(f) not in seen]
        seen.update(_key(f) for f in findings)
        entry["new_findings"] = len(new)
        rounds.append(entry)
        co.store.jobs.update(job.job_id, result=result)
        co.store.add_event(job.job_id, "job.round", entry)
        if problem:
            result["stopped"] = "the reviewer gave no valid answer"
            co.finish(JobStatus.FAILED, result, {"kind": "reviewer", "message": problem + "."})
            return
        if verdict == "approve" or not new or round_no == job.spec["rounds"]:
            result["stopped"] = (
                "approved"
                if verdict == "approve"
                else "no new findings"
                if not new
                else "round limit"
            )
            break
        co.alive()
        if record.turn < round_no:  # a resumed coordinator finds this turn already queued
            queue_follow_up(co.ctx, impl, follow_up_message(new))
    result["winner"] = impl
    co.finish(JobStatus.SUCCEEDED, result)
