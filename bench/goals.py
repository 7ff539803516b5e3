"""Every goal of the benchmark in one table: results.json key -> what it measures, the goal and
how the figure is compared with it. `python -m bench` prints one row per entry, the figure
beside its goal; a figure a run did not measure (--quick leaves some out) says so.

Adding a figure is one line here, plus putting its value under that key in the results (see
`figures` in bench/__main__.py, or a module's `figures` dict, as bench/pool.py's would be)."""

from __future__ import annotations

import operator
from dataclasses import dataclass


@dataclass(frozen=True)
class Goal:
    label: str
    goal: float
    unit: str = "x"  # "x" for a ratio, else the figure's unit ("ms", "s")
    at_most: bool = True  # the figure meets the goal when <= it (False: when >= it)

    def met(self, value: float) -> bool:
        return (operator.le if self.at_most else operator.ge)(value, self.goal)

    def shown(self) -> str:
        unit = "x" if self.unit == "x" else f" {self.unit}"
        return f"{'<=' if self.at_most else '>='} {self.goal:g}{unit}"


GOALS: dict[str, Goal] = {
    # issue 23's table
    "task_vs_floor_ratio": Goal("one task, CLI, 5,000 files / floor", 1.0),
    "library_vs_floor_ratio": Goal("one task, library, 5,000 files / floor", 0.8),
    "task_50k_vs_5k_ratio": Goal("same task at 50,000 files / at 5,000", 1.2),
    "concurrency_makespan_ratio": Goal("8 tasks at limit 4 / ideal", 1.15),
    "environment_warm_200_vs_generic_ratio": Goal("warm env task, 200 packages / generic", 1.05),
    "environment_warm_50k_files_vs_generic_ratio": Goal(
        "warm env task, 50,000-file node_modules / generic", 1.05
    ),
    "task_cpu_vs_floor_ratio": Goal("CPU of one task (host processes) / floor's", 1.0),
    # issue 42: no warm process, a plain process per command
    "cli_tasks_show_ms": Goal("`worker-bridge tasks show ID`", 250.0, "ms"),
    "cli_tasks_list_ms": Goal("`worker-bridge tasks list`", 250.0, "ms"),
    "cli_help_ms": Goal("`worker-bridge --help`", 150.0, "ms"),
    # issue 44: tasks on the simulated cluster (bench/cluster.py)
    "cluster_task_overhead_s": Goal(
        "one task through a node - the same task here, 5,000 files, base warm", 0.15, "s"
    ),
    "cluster_makespan_ratio": Goal("8 x 2 s tasks, 2 nodes x 2 slots / 1 node x 2 slots", 0.55),
    # issue 23, part 2: the pool (bench/pool.py); on by default only where it pays
    "pool_task_vs_cold_ratio": Goal("one task, library, pool on / pool off", 0.9),
    "concurrency_pool_makespan_ratio": Goal("8 tasks at limit 4 / ideal, pool on (size 4)", 1.15),
    "pool_container_start_ms": Goal(
        "a container from the pool, claim to exit of `true`", 100.0, "ms"
    ),
    # earlier issues' targets
    "store_read_p99_ms": Goal("store read p99", 20.0, "ms"),
    "mcp_delegate_ms": Goal("MCP delegate -> task id, median", 150.0, "ms"),
    "large_change_vs_floor_ratio": Goal("collect the largest change / git's floor", 1.5),
    "large_task_phase_vs_floor_ratio": Goal("large task, worst phase / floor", 2.0),
    "compete_vs_serial_ratio": Goal("compete of 4 / the same tasks serially", 0.6),
}


def print_goals(results: dict, details: dict[str, str]) -> None:
    """One line per goal: the figure, the goal, met or MISSED, and what it was made of."""
    print(f"\n{'figure':<62} {'value':>10} {'goal':>10}")
    for key, goal in GOALS.items():
        value = results.get(key)
        if value is None:
            print(f"{goal.label:<62} {'-':>10} {goal.shown():>10} not measured in this run")
            continue
        mark = "met" if goal.met(value) else "MISSED"
        shown = (
            f"{value:.3f}x"
            if goal.unit == "x"
            else f"{value:.{2 if goal.unit == 's' else 1}f} {goal.unit}"
        )
        note = f"  ({details[key]})" if key in details else ""
        print(f"{goal.label:<62} {shown:>10} {goal.shown():>10} {mark}{note}")
