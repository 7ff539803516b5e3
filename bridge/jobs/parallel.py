"""Fanout and integrate jobs. A fanout runs several objectives on one base, one task each, in
parallel within the limits. An integrate merges chosen verified tasks one after another onto
the common base (merging.py), each cumulative result an ordinary task verified on its own, and
stops at the first conflict or failed verification with a report that names it; the last
verified step is the integration the caller accepts (`jobs accept`)."""

from __future__ import annotations

from pathlib import Path

from bridge.documents import IntegrationStep, JobFindings, Part, Skipped
from bridge.errors import CircuitOpen
from bridge.jobs.coordinator import JobCoordinator
from bridge.jobs.merging import Merger
from bridge.jobs.slots import fanout_spec, integration_spec
from bridge.models import JobStatus, Status


def run_fanout(co: JobCoordinator) -> None:
    job = co.job()
    task_ids = []
    skipped: list[Skipped] = []
    for n in range(len(job.spec["objectives"])):
        co.alive()
        spec = fanout_spec(job.spec, job.job_id, n)
        try:
            task_ids.append(co.ensure_task(spec, "part", f"o{n + 1}"))
        except CircuitOpen as refused:  # its breaker opened since the job was made
            skipped.append(co.skip(f"o{n + 1}", spec["worker"], "part", refused))
    for task_id in task_ids:
        co.start(task_id)
    records = co.wait_all(task_ids) if task_ids else []
    failed = [r.task_id for r in records if r.status != Status.SUCCEEDED]
    result = JobFindings(
        parts=[Part(task_id=r.task_id, status=str(r.status)) for r in records],
        skipped=skipped,
    )
    if skipped:
        message = f"{len(skipped)} of {len(job.spec['objectives'])} objectives were not run: "
        co.finish(
            JobStatus.FAILED,
            result,
            {"kind": "circuit_open", "message": message + skipped[0]["reason"]},
        )
        return
    if failed:
        message = f"{len(failed)} of {len(records)} tasks did not succeed: {', '.join(failed)}."
        co.finish(JobStatus.FAILED, result, {"kind": "part_failed", "message": message})
        return
    co.finish(JobStatus.SUCCEEDED, result)


def _unfaithful(merger: Merger, tree: str | None, snapshot: str | None) -> list[str]:
    """The paths where an integration step's snapshot differs from the merged tree it was
    built to reproduce (content or mode): a step that differs is a wrong result, not offered."""
    if tree is None or snapshot is None:
        return ["its snapshot"]
    return merger.differences(tree, snapshot)


def run_integrate(co: JobCoordinator) -> None:
    job = co.job()
    spec = job.spec
    snapshots = [
        (task_id, snapshot or "")
        for task_id, snapshot in zip(spec["tasks"], spec["snapshots"], strict=True)
    ]
    scratch = job.config.home / "jobs" / job.job_id
    bound = job.config.jobs.integration_kb << 10
    merger = Merger(Path(spec["repository"]), spec["base_commit"] or "", scratch, bound)
    steps = merger.steps(snapshots)
    report: list[IntegrationStep] = []
    result = JobFindings(steps=report, winner=None)
    for n, step in enumerate(steps, start=1):
        entry = IntegrationStep(task_id=step.task_id, step=n, conflict=step.conflict)
        report.append(entry)
        if step.problem:
            entry["problem"] = step.problem
            break
        co.alive()
        task = co.ensure_task(
            integration_spec(spec, job.job_id, n, step.write, step.delete, step.modes),
            "integration",
            f"step-{n}",
        )
        co.start(task)
        (record,) = co.wait_all([task])
        entry["integration_task"] = task
        entry["status"] = str(record.status)
        entry["verification_ok"] = record.verification.ok if record.verification else None
        co.store.jobs.update(job.job_id, result=result)
        co.store.add_event(job.job_id, "job.round", entry)
        if record.status != Status.SUCCEEDED:
            why = record.error.message if record.error else f"it ended {record.status}"
            entry["problem"] = f"After task {step.task_id} the checks failed: {why}"
            break
        differ = _unfaithful(merger, step.tree, record.snapshot_commit)
        if differ:
            entry["problem"] = (
                f"Step {n}'s task {task} does not reproduce the merge of the tasks up to "
                f"{step.task_id} (it differs on {', '.join(differ[:10])}); it is not offered."
            )
            break
        result["winner"] = task
    stopped = next((e for e in report if e.get("problem")), None)
    if stopped is None:
        co.finish(JobStatus.SUCCEEDED, result)
        return
    applied = len([e for e in report if e.get("status") == "succeeded"])
    message = f"{stopped['problem']} ({applied} of {len(snapshots)} applied and verified.)"
    co.finish(JobStatus.FAILED, result, {"kind": "integration", "message": message})
