"""One task through worker-bridge, by the CLI (a process per task) and by the library (in
process), alternated with the floor: A B A B ..., reporting the median per-pair ratio."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import median, tasks_run_command
from bench.floor import run_floor

MOCK = {"mock": {"script": "echo appended >> target.txt"}}
VERIFY = "grep -q appended target.txt"


def run_cli_task(repo: Path, home: Path) -> tuple[float, dict[str, Any]]:
    cmd = tasks_run_command(repo, "append a line", MOCK, VERIFY)
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t0
    result = json.loads(proc.stdout)
    if result["status"] != "succeeded":
        raise RuntimeError(f"bench task failed: {result['error']}")
    return elapsed, result


def run_library_task(bridge, repo: Path) -> tuple[float, dict[str, Any]]:
    spec = {
        "objective": "append a line",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": [VERIFY]},
        "metadata": MOCK,
    }
    return timed_task(bridge, spec)


def timed_task(bridge, spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Create and run one task through the library; (seconds, result), or RuntimeError."""
    t0 = time.perf_counter()
    task = bridge.create_task(spec)
    result = bridge.run_task(task.task_id).document()
    elapsed = time.perf_counter() - t0
    if result["status"] != "succeeded":
        raise RuntimeError(f"bench task {task.task_id} failed: {result['error']}")
    return elapsed, result


def alternate(pairs: int, floor, subject) -> dict[str, Any]:
    """Warm up once, then A B A B ...; per-pair ratios subject/floor."""
    floor()
    subject()
    floors, subjects, ratios, phases = [], [], [], []
    for _ in range(pairs):
        f = floor()
        s, result = subject()
        floors.append(f)
        subjects.append(s)
        ratios.append(s / f)
        phases.append(result.get("timings", {}))
    keys = sorted({k for p in phases for k in p})
    return {
        "ratio_median": median(ratios),
        "floor_median_s": median(floors),
        "bridge_median_s": median(subjects),
        "phases_median_s": {k: median([p[k] for p in phases if k in p]) for k in keys},
        "samples": {"floor_s": floors, "bridge_s": subjects, "ratios": ratios},
    }


def bench_one_task(repo: Path, home: Path, scratch: Path, image: str, pairs: int) -> dict:
    def floor() -> float:
        return run_floor(repo, scratch, image, VERIFY)

    return alternate(pairs, floor, lambda: run_cli_task(repo, home))


def bench_library(repo: Path, home: Path, scratch: Path, image: str, pairs: int) -> dict:
    from bridge import WorkerBridge

    bridge = WorkerBridge(home=home)
    try:
        return alternate(
            pairs,
            lambda: run_floor(repo, scratch, image, VERIFY),
            lambda: run_library_task(bridge, repo),
        )
    finally:
        bridge.close()
