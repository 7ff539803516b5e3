"""Jobs: a compete of 4 mock candidates (each sleeping, then verified) against the same 4 tasks
run one after another through the library, at the host limit (4 containers, and 4 per
repository so the repository limit does not bind first). The figure is the ratio of the job's
wall time to the serial tasks' sum, both measured in this run: 0.25 is perfect overlap; what
is above it is the job's own cost (its coordinator process, polling, ranking)."""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import make_repo, median

JOB_ENDED = {"succeeded", "unresolved", "failed", "cancelled", "accepted"}
CANDIDATES = 4


def _spec(repo: Path, sleep: float) -> dict:
    return {
        "objective": "bench candidate",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": ["test -f notes.txt"]},
        "metadata": {
            "mock": {"sleep": sleep},
            "candidates": [
                {"mock": {"sleep": sleep, "write": {"notes.txt": "x\n" * (n + 1)}}}
                for n in range(CANDIDATES)
            ],
        },
    }


def _one(bridge, repo: Path, sleep: float, n: int) -> float:
    spec = _spec(repo, sleep)
    spec["metadata"] = spec["metadata"]["candidates"][n]
    t0 = time.perf_counter()
    result = bridge.run_task(bridge.create_task(spec).task_id)
    if result.status != "succeeded":
        raise RuntimeError(f"jobs bench: a single task ended {result.status}: {result.error}")
    return time.perf_counter() - t0


def _compete(bridge, repo: Path, sleep: float) -> float:
    t0 = time.perf_counter()
    job = bridge.compete(_spec(repo, sleep), ["mock"], attempts=CANDIDATES)
    while (status := bridge.job_status(job.job_id)).status not in JOB_ENDED:
        time.sleep(0.05)
    if status.status != "succeeded":
        raise RuntimeError(f"jobs bench: the compete ended {status.status}: {status.error}")
    return time.perf_counter() - t0


def bench_jobs(root: Path, sleep: float, pairs: int) -> dict:
    from bridge import WorkerBridge

    repo = make_repo(root / "jobs-repo", files=20, total_mb=0.1)
    bridge = WorkerBridge(
        home=root / "home-jobs", max_concurrency=CANDIDATES, repo_concurrency=CANDIDATES
    )
    serial, jobs = [], []
    try:
        for _ in range(pairs):
            serial.append(sum(_one(bridge, repo, sleep, n) for n in range(CANDIDATES)))
            jobs.append(_compete(bridge, repo, sleep))
    finally:
        bridge.close()
    ratios = [j / s for j, s in zip(jobs, serial, strict=True)]
    return {
        "candidates": CANDIDATES,
        "limit": CANDIDATES,
        "sleep_s": sleep,
        "serial_median_s": median(serial),
        "compete_median_s": median(jobs),
        "ratio_median": median(ratios),
        "samples": {"serial_s": serial, "compete_s": jobs},
    }


def print_jobs(found: dict) -> None:
    print(
        f"jobs: compete of {found['candidates']} at limit {found['limit']} "
        f"{found['compete_median_s']:.2f} s vs {found['serial_median_s']:.2f} s one after "
        f"another (ratio {found['ratio_median']:.3f}; 0.25 is perfect overlap)"
    )
