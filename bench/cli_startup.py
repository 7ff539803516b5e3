"""The CLI's start-up: `worker-bridge --help`, `tasks show ID` and `tasks list` as new processes
on a state root that holds tasks, 10 runs each alternated (A B C A B C ...), median wall and CPU
time; beside them the bare interpreter (`python -c pass`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.common import median, run_process

WORKER_BRIDGE = str(Path(sys.executable).parent / "worker-bridge")


def bench_cli_startup(home: Path, task_id: str, runs: int) -> dict:
    commands = {
        "help": [WORKER_BRIDGE, "--help"],
        "tasks_show": [WORKER_BRIDGE, "tasks", "show", task_id],
        "tasks_list": [WORKER_BRIDGE, "tasks", "list"],
        "python": [sys.executable, "-c", "pass"],
    }
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, cmd in commands.items():
            usage, _ = run_process(cmd, env)
            walls[name].append(usage.wall_s * 1000)
            cpus[name].append(usage.cpu_s * 1000)
    return {
        "runs": runs,
        "wall_median_ms": {n: round(median(v), 1) for n, v in walls.items()},
        "cpu_median_ms": {n: round(median(v), 1) for n, v in cpus.items()},
        "samples_ms": walls,
    }


def print_cli_startup(result: dict) -> None:
    wall, cpu = result["wall_median_ms"], result["cpu_median_ms"]
    print(f"\nCLI start-up (median of {result['runs']}, wall / CPU):")
    for name in wall:
        print(f"  {name:<20} {wall[name]:>7.1f} ms / {cpu[name]:>6.1f} ms")
