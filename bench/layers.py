"""Layered checkouts (issue 23, part 1): one one-file task through the library with the task's
worktree and verification checkout as overlays over the base's cached tree (`layered`), against
the same task with full checkouts (`full`, `layered_checkouts: off`) and the floor, at 5,000 and
50,000 files, alternated in the same run (floor, layered, full, ...).

`bench_layers()` returns the figures as a dict (keys in its docstring); alone:
`python -m bench.layers [--quick] [--sizes 5000,50000] [--pairs N]`.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import make_repo, median, scratch_root
from bench.floor import run_floor
from bench.task import VERIFY, run_library_task

MODES = ("layered", "full")


def _bridge(home: Path, mode: str):  # noqa: ANN202
    from bridge import WorkerBridge

    home.mkdir(parents=True)
    setting = "true" if mode == "layered" else "false"
    (home / "config.yaml").write_text(f"layered_checkouts: {setting}\n")
    return WorkerBridge(home=home)


def _checkout_kind(bridge, task_id: str) -> str:  # noqa: ANN001
    """What the task's own events say was made ('layered' or 'full')."""
    for event in bridge.task_logs(task_id).events:
        if event.kind == "workspace.ready":
            return str(event.data.get("checkout", "full"))
    return "unknown"


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (git, the docker CLI; not the
    engine's daemon, for either side)."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _with_cpu(fn):  # noqa: ANN001, ANN202
    before = _cpu()
    out = fn()
    return out, _cpu() - before


def bench_size(files: int, pairs: int, image: str, root: Path) -> dict[str, Any]:
    repo = make_repo(root / f"repo-{files}", files, total_mb=files / 100)
    bridges = {mode: _bridge(root / f"home-{mode}-{files}", mode) for mode in MODES}
    scratch = root / f"floor-{files}"
    scratch.mkdir()
    samples: dict[str, list[float]] = {"floor": [], **{m: [] for m in MODES}}
    cpu: dict[str, list[float]] = {"floor": [], **{m: [] for m in MODES}}
    phases: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    kinds: dict[str, set[str]] = {m: set() for m in MODES}
    try:
        for n in range(pairs + 1):  # the first round warms up (and caches the base tree)
            floor_s, floor_cpu = _with_cpu(lambda: run_floor(repo, scratch, image, VERIFY))
            results = {
                mode: _with_cpu(lambda mode=mode: run_library_task(bridges[mode], repo))
                for mode in MODES
            }
            if n == 0:
                continue
            samples["floor"].append(floor_s)
            cpu["floor"].append(floor_cpu)
            for mode, ((seconds, result), used) in results.items():
                samples[mode].append(seconds)
                cpu[mode].append(used)
                phases[mode].append(result.get("timings", {}))
                kinds[mode].add(_checkout_kind(bridges[mode], result["task_id"]))
    finally:
        for bridge in bridges.values():
            bridge.close()
    out: dict[str, Any] = {
        "files": files,
        "floor_s": median(samples["floor"]),
        "floor_cpu_s": median(cpu["floor"]),
    }
    for mode in MODES:
        ratios = [s / f for s, f in zip(samples[mode], samples["floor"], strict=True)]
        keys = sorted({k for p in phases[mode] for k in p})
        out[mode] = {
            "task_s": median(samples[mode]),
            "vs_floor_ratio": median(ratios),
            "cpu_s": median(cpu[mode]),
            "checkout": sorted(kinds[mode]),
            "phases_s": {k: median([p[k] for p in phases[mode] if k in p]) for k in keys},
            "samples_s": samples[mode],
        }
    out["samples_floor_s"] = samples["floor"]
    return out


def bench_layers(
    sizes: tuple[int, ...] = (5000, 50000), pairs: int = 4, image: str | None = None
) -> dict[str, Any]:
    """Keys: ``layers_<files>`` per size, each with ``floor_s`` and ``floor_cpu_s``, and per
    mode (``layered``, ``full``): ``task_s``, ``vs_floor_ratio``, ``cpu_s`` (this process and
    its waited-for children; the engine's daemon is in neither figure, nor the trash's
    background remover), ``checkout`` (what the tasks' events say ran), ``phases_s`` (the
    median of each timing) and the samples. Then ``layered_growth_ratio`` and
    ``full_growth_ratio`` (the task at the largest size over the task at the smallest: the
    issue's "≤ 1.2× its own 5,000-file time"), ``layered_vs_floor_ratio`` (at the smallest
    size), ``layered_vs_full_ratio`` (at the largest), and ``containers`` (see
    `container_costs`)."""
    if image is None:
        from bridge.config.settings import load_config

        image = load_config().image_for("base")
    root = Path(tempfile.mkdtemp(prefix="wb-bench-layers-", dir=scratch_root()))
    figures: dict[str, Any] = {}
    try:
        for files in sizes:
            figures[f"layers_{files}"] = bench_size(files, pairs, image, root)
    finally:
        from bridge.workspace.overlay import unmount_under

        unmount_under(root)  # the tasks' worktrees are kept (mounted) until pruned
        shutil.rmtree(root, ignore_errors=True)
    small, large = figures[f"layers_{min(sizes)}"], figures[f"layers_{max(sizes)}"]
    for mode in MODES:
        figures[f"{mode}_growth_ratio"] = large[mode]["task_s"] / small[mode]["task_s"]
    figures["layered_vs_floor_ratio"] = small["layered"]["vs_floor_ratio"]
    figures["layered_vs_full_ratio"] = large["layered"]["task_s"] / large["full"]["task_s"]
    figures["containers"] = container_costs(image)
    return figures


def container_costs(image: str, samples: int = 8) -> dict[str, float]:
    """What a pool of containers could take off a task's path, on this engine: the medians of
    ``create_ms`` (what a pool of created containers saves), ``start_ms`` (the engine's start
    of a created one: what only a pool of started containers saves) and ``exec_ms`` (a command
    run in an already started one, the round trip such a pool would pay instead)."""
    import docker

    client = docker.from_env()
    labels = {"io.worker-bridge.bench": "1"}
    created, started, execs = [], [], []
    host = client.api.create_host_config(network_mode="none", cap_drop=["ALL"], read_only=True)
    try:
        for _ in range(samples):
            t0 = time.perf_counter()
            cid = client.api.create_container(image, ["true"], labels=labels, host_config=host)
            t1 = time.perf_counter()
            client.api.start(cid["Id"])
            t2 = time.perf_counter()
            client.api.wait(cid["Id"])
            client.api.remove_container(cid["Id"], force=True)
            created.append((t1 - t0) * 1000)
            started.append((t2 - t1) * 1000)
        idle = client.api.create_container(image, ["sleep", "300"], labels=labels, host_config=host)
        client.api.start(idle["Id"])
        try:
            for _ in range(samples):
                t0 = time.perf_counter()
                run = client.api.exec_create(idle["Id"], ["true"])
                client.api.exec_start(run["Id"])
                client.api.exec_inspect(run["Id"])
                execs.append((time.perf_counter() - t0) * 1000)
        finally:
            client.api.remove_container(idle["Id"], force=True)
    finally:
        client.close()
    return {"create_ms": median(created), "start_ms": median(started), "exec_ms": median(execs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 and 5,000 files, one pair")
    parser.add_argument("--sizes", default="5000,50000")
    parser.add_argument("--pairs", type=int, default=4)
    args = parser.parse_args()
    sizes = (500, 5000) if args.quick else tuple(int(s) for s in args.sizes.split(","))
    figures = bench_layers(sizes, 1 if args.quick else args.pairs)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
