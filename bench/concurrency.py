"""Concurrency: N tasks whose mock worker sleeps, started by separate processes under a host
limit; makespan (the median of `bursts` bursts) against the ideal (waves of one task, the single
task measured in this run)."""

from __future__ import annotations

import math
import os
import subprocess
import time
from pathlib import Path

from bench.common import make_repo, median, tasks_run_command


def _cmd(repo: Path, sleep: float) -> list[str]:
    return tasks_run_command(repo, "sleep", {"mock": {"sleep": sleep}})


def _burst(repos: list[Path], env: dict[str, str], sleep: float) -> float:
    """All the tasks' processes started at once; the time until the last has exited."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(_cmd(repo, sleep), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for repo in repos
    ]
    codes = [p.wait() for p in procs]
    makespan = time.perf_counter() - t0
    if any(codes):
        raise RuntimeError(f"concurrency bench: exit codes {codes}")
    return makespan


def bench_concurrency(root: Path, tasks: int, limit: int, sleep: float, bursts: int = 3) -> dict:
    repos = [make_repo(root / f"repo{i}", files=20, total_mb=0.1) for i in range(tasks)]
    home = root / "home"
    env = {
        **os.environ,
        "WORKER_BRIDGE_HOME": str(home),
        "WORKER_BRIDGE_MAX_CONCURRENCY": str(limit),
    }
    singles = []
    for i in range(3):
        t0 = time.perf_counter()
        subprocess.run(_cmd(repos[i % len(repos)], sleep), env=env, check=True, capture_output=True)
        singles.append(time.perf_counter() - t0)
    single = median(singles)
    makespans = [_burst(repos, env, sleep) for _ in range(bursts)]
    makespan = median(makespans)
    waves = math.ceil(tasks / limit)
    ideal = waves * single
    return {
        "tasks": tasks,
        "limit": limit,
        "sleep_s": sleep,
        "single_task_s": single,
        "ideal_s": ideal,
        "makespan_s": makespan,
        "ratio": makespan / ideal,
        "samples": {"single_s": singles, "makespan_s": makespans},
    }
