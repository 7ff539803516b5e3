"""Detached job coordinators (`python -m bridge.jobs --store PATH JOB_ID RUNNER_ID`), started and
recovered like task runners (bridge/pipeline/detached.py): a reservation is a compare-and-set
on the runner id the caller saw, so of several processes recovering one job, one wins."""

from __future__ import annotations

from pathlib import Path

from bridge.config.settings import Config
from bridge.phase.context import Context
from bridge.pipeline.detached import STARTUP_GRACE, launch_detached
from bridge.store import Store
from bridge.store.owners import Owner, new_runner_id


def spawn_coordinator(config: Config, store: Store, job_id: str, replacing: str | None) -> bool:
    """Reserve the job and launch its coordinator process; False if another process won."""
    runner_id = new_runner_id()
    if not store.job_runners.reserve(job_id, runner_id, STARTUP_GRACE, replacing):
        return False
    launch_detached(config, "bridge.jobs", f"job-{job_id}.log", job_id, runner_id)
    return True


def recover_jobs(ctx: Context) -> list[str]:
    """A coordinator for each job whose coordinator died; their ids."""
    recovered = []
    for row in ctx.store.job_runners.stranded():
        if spawn_coordinator(ctx.config, ctx.store, row["job_id"], row["runner_id"]):
            ctx.store.add_event(row["job_id"], "job.recovering", {"status": row["status"]})
            recovered.append(row["job_id"])
    return recovered


def run_coordinator(store_path: Path, job_id: str, runner_id: str) -> None:
    """The body of a coordinator process: the job's own configuration, the Docker engine."""
    from bridge.jobs.compete import run_compete
    from bridge.jobs.coordinator import JobCoordinator
    from bridge.jobs.parallel import run_fanout, run_integrate
    from bridge.jobs.review import run_review
    from bridge.sandbox.docker import DockerSandbox

    store = Store(store_path)
    try:
        job = store.jobs.record(job_id)
        ctx = Context(job.config, store, DockerSandbox())
        body = {
            "compete": run_compete,
            "review": run_review,
            "fanout": run_fanout,
            "integrate": run_integrate,
        }[job.kind]
        JobCoordinator(ctx, job_id, Owner(id=runner_id)).run(body)
    finally:
        store.close()
