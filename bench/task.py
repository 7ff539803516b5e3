"""One task through worker-bridge, by the CLI (a process per task) and by the library (in
process), alternated with the floor: A B A B ..., reporting the median per-pair ratio of wall
time and of CPU time (host processes: the CLI's own process and the git processes it waits for,
or the library's process; the floor's git and docker CLI processes), the task's phases (and the
bookkeeping outside them) and the CLI process's peak memory. Also the same task at two
repository sizes, alternated (`bench_scale`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.common import Usage, measured, median, run_process, tasks_run_command
from bench.floor import run_floor

MOCK = {"mock": {"script": "echo appended >> target.txt"}}
VERIFY = "grep -q appended target.txt"
PHASES = ("queued_s", "prepare_s", "environment_s", "worker_s", "collect_s", "verify_s")


def run_cli_task(repo: Path, home: Path) -> tuple[Usage, dict[str, Any]]:
    cmd = tasks_run_command(repo, "append a line", MOCK, VERIFY)
    usage, stdout = run_process(cmd, {**os.environ, "WORKER_BRIDGE_HOME": str(home)})
    result = json.loads(stdout)
    if result["status"] != "succeeded":
        raise RuntimeError(f"bench task failed: {result['error']}")
    return usage, result


def run_library_task(bridge, repo: Path) -> tuple[Usage, dict[str, Any]]:
    spec = {
        "objective": "append a line",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": [VERIFY]},
        "metadata": MOCK,
    }
    usage, (_, result) = measured(lambda: timed_task(bridge, spec), in_process=True)
    return usage, result


def timed_task(bridge, spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Create and run one task through the library; (seconds, result), or RuntimeError."""
    usage, result = measured(lambda: bridge.run_task(bridge.create_task(spec).task_id))
    document = result.document()
    if document["status"] != "succeeded":
        raise RuntimeError(f"bench task {document['task_id']} failed: {document['error']}")
    return usage.wall_s, document


def phases(wall_s: float, result: dict[str, Any]) -> dict[str, float]:
    """The task's own phase timings, and the bookkeeping no phase covers (for the CLI that
    includes the interpreter's start-up and imports)."""
    timings = result.get("timings", {})
    found = {k: timings[k] for k in PHASES if k in timings}
    found["bookkeeping_s"] = round(wall_s - sum(timings.values()), 3)
    return found


def _phase_medians(samples: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in (*PHASES, "bookkeeping_s") if any(k in p for p in samples)]
    return {k: round(median([p[k] for p in samples if k in p]), 3) for k in keys}


def alternate(pairs: int, floor, subject) -> dict[str, Any]:
    """Warm up once, then A B A B ...; per-pair ratios subject/floor, of wall and CPU time."""
    floor()
    subject()
    floors, subjects, cpu_ratios, samples = [], [], [], []
    for _ in range(pairs):
        usage, seconds = measured(floor)
        f = Usage(seconds, usage.cpu_s)  # the floor's own clock leaves out its branch's removal
        s, result = subject()
        floors.append(f)
        subjects.append(s)
        cpu_ratios.append(s.cpu_s / f.cpu_s)
        samples.append(phases(s.wall_s, result))
    rss = [s.peak_rss_mb for s in subjects if s.peak_rss_mb is not None]
    ratios = [s.wall_s / f.wall_s for f, s in zip(floors, subjects, strict=True)]
    return {
        "ratio_median": median(ratios),
        "floor_median_s": median([f.wall_s for f in floors]),
        "bridge_median_s": median([s.wall_s for s in subjects]),
        "cpu_ratio_median": round(median(cpu_ratios), 3),
        "floor_cpu_median_s": round(median([f.cpu_s for f in floors]), 3),
        "bridge_cpu_median_s": round(median([s.cpu_s for s in subjects]), 3),
        "peak_rss_mb": max(rss) if rss else None,
        "phases_median_s": _phase_medians(samples),
        "samples": {
            "floor_s": [f.wall_s for f in floors],
            "bridge_s": [s.wall_s for s in subjects],
            "ratios": ratios,
            "floor_cpu_s": [f.cpu_s for f in floors],
            "bridge_cpu_s": [s.cpu_s for s in subjects],
        },
    }


def bench_one_task(repo: Path, home: Path, scratch: Path, image: str, pairs: int) -> dict:
    return alternate(
        pairs, lambda: run_floor(repo, scratch, image, VERIFY), lambda: run_cli_task(repo, home)
    )


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


def bench_scale(small: Path, large: Path, home: Path, pairs: int, *, warm_up: bool = True) -> dict:
    """The same one-file task through the CLI on two repositories (``large`` has more files),
    alternated, after one warm-up each: the per-pair ratio large/small, and each size's phases
    and peak memory."""
    if warm_up:
        run_cli_task(small, home)
        run_cli_task(large, home)
    sizes: dict[str, list[tuple[Usage, dict[str, Any]]]] = {"small": [], "large": []}
    for _ in range(pairs):
        sizes["small"].append(run_cli_task(small, home))
        sizes["large"].append(run_cli_task(large, home))

    def summary(runs: list[tuple[Usage, dict[str, Any]]]) -> dict[str, Any]:
        return {
            "median_s": round(median([u.wall_s for u, _ in runs]), 3),
            "cpu_median_s": round(median([u.cpu_s for u, _ in runs]), 3),
            "peak_rss_mb": max(u.peak_rss_mb or 0 for u, _ in runs),
            "phases_median_s": _phase_medians([phases(u.wall_s, r) for u, r in runs]),
        }

    pairs_run = zip(sizes["small"], sizes["large"], strict=True)
    ratios = [lg.wall_s / sm.wall_s for (sm, _), (lg, _) in pairs_run]
    return {
        "pairs": pairs,
        "ratio_median": round(median(ratios), 3),
        "small": summary(sizes["small"]),
        "large": summary(sizes["large"]),
        "samples": {"ratios": ratios},
    }
