"""The container pool (issue 23, part 2): the same one-file task with the pool off and on
(`pool.size` 0 and 1), alternated in each round (off, on, off, on ...); one container started
cold against one claimed from the pool; and 8 tasks at limit 4 (bench/concurrency.py) with the
pool off and on.

Library tasks run in this process on a 5,000-file repository (`--quick`: 1,000) in a state root
of their own per mode; after each task the pool's fillers finish before the next one starts
(the refill runs while the task runs, so its cost on the two cores is inside the task's time;
it is not in the next one's). The first round warms up (the base's kept tree, the first fill).

`bench_pool(root, quick)` returns {"figures": {...}, ...}; the figures' keys are in
bench/goals.py. Alone: `python -m bench.pool [--quick]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import make_repo, median, scratch_root
from bench.concurrency import bench_concurrency
from bench.task import run_library_task

SIZES = {"off": 0, "on": 1}


def _bridge(home: Path, size: int):  # noqa: ANN202
    from bridge import WorkerBridge

    home.mkdir(parents=True)
    (home / "config.yaml").write_text(f"pool:\n  size: {size}\n")
    return WorkerBridge(home=home)


def _pooled(bridge, task_id: str) -> list[bool]:  # noqa: ANN001
    return [
        bool(e.data.get("pooled"))
        for e in bridge.task_logs(task_id).events
        if e.kind == "sandbox.pool"
    ]


def bench_tasks(root: Path, files: int, pairs: int) -> dict[str, Any]:
    from bridge.sandbox.pool import wait_for_fillers

    repo = make_repo(root / f"repo-{files}", files, total_mb=files / 100)
    bridges = {mode: _bridge(root / f"home-pool-{mode}", size) for mode, size in SIZES.items()}
    walls: dict[str, list[float]] = {m: [] for m in SIZES}
    phases: dict[str, list[dict[str, float]]] = {m: [] for m in SIZES}
    hits, containers = 0, 0
    try:
        for n in range(pairs + 1):
            for mode in SIZES:
                usage, result = run_library_task(bridges[mode], repo)
                wait_for_fillers()
                if n == 0:
                    continue
                walls[mode].append(usage.wall_s)
                phases[mode].append(result.get("timings", {}))
                if mode == "on":
                    pooled = _pooled(bridges[mode], result["task_id"])
                    hits, containers = hits + sum(pooled), containers + len(pooled)
    finally:
        for bridge in bridges.values():
            drain = getattr(bridge.context().sandbox, "drain", None)
            if drain is not None:
                drain()
            bridge.close()
    ratios = [on / off for on, off in zip(walls["on"], walls["off"], strict=True)]

    def phase(mode: str, key: str) -> float:
        return median([p.get(key, 0.0) for p in phases[mode]])

    return {
        "files": files,
        "pairs": pairs,
        "off_s": median(walls["off"]),
        "on_s": median(walls["on"]),
        "ratio": median(ratios),
        "pooled_share": hits / containers if containers else 0.0,
        "phases": {
            mode: {k: phase(mode, k) for k in ("prepare_s", "worker_s", "collect_s", "verify_s")}
            for mode in SIZES
        },
        "samples": walls,
    }


def bench_container(root: Path, image: str, samples: int) -> dict[str, float]:
    """One container running `true`: started cold (create + start) and waited for, against
    claimed from the pool (claim, attach, hand over) and waited for; both removed untimed."""
    from bridge.config.sections import PoolConfig
    from bridge.sandbox import LABEL, ContainerSpec, DockerSandbox, Mount, home_id
    from bridge.sandbox.pool import PooledSandbox, wait_for_fillers
    from bridge.store import Store

    home = root / "home-pool-containers"
    workspace = home / "workspace"
    workspace.mkdir(parents=True)
    store = Store(home / "bridge.db")
    engine = DockerSandbox()
    sandbox = PooledSandbox(engine, store.pool, home, PoolConfig(size=1))
    labels = {f"{LABEL}.role": "verify", f"{LABEL}.home": home_id(home), f"{LABEL}.bench": "1"}
    spec = ContainerSpec(
        image, ["true"], "10001:10001", labels, [Mount(workspace, "/workspace", False)]
    )
    cold, pooled = [], []
    try:
        for _ in range(samples):
            t0 = time.perf_counter()
            container = engine.start(spec)
            engine.wait(container, 60)
            cold.append(time.perf_counter() - t0)
            engine.remove(container)
            sandbox.prefill(spec)
            t0 = time.perf_counter()
            container = sandbox.start(spec)
            sandbox.wait(container, 60)
            pooled.append(time.perf_counter() - t0)
            sandbox.remove(container)
            wait_for_fillers()
    finally:
        wait_for_fillers()
        sandbox.drain()
        store.close()
    return {"cold_ms": median(cold) * 1000, "pooled_ms": median(pooled) * 1000}


def _drain(home: Path) -> None:
    """Remove the idle pooled containers a state root's processes left."""
    from bridge import WorkerBridge

    if not home.is_dir():
        return
    bridge = WorkerBridge(home=home)
    try:
        drain = getattr(bridge.context().sandbox, "drain", None)
        if drain is not None:
            drain()
    finally:
        bridge.close()


def bench_pool(root: Path, quick: bool) -> dict[str, Any]:
    from bridge.config.settings import load_config

    image = load_config().verify_image_ref
    files, pairs = (1000, 2) if quick else (5000, 7)
    tasks = bench_tasks(root / "pool-tasks", files, pairs)
    container = bench_container(root / "pool-containers", image, 3 if quick else 8)
    waves: dict[str, dict] = {}
    if not quick:
        for mode, size in (("off", 0), ("on", 4)):
            os.environ["WORKER_BRIDGE_POOL__SIZE"] = str(size)
            try:
                waves[mode] = bench_concurrency(root / f"pool-waves-{mode}", 8, 4, 1.0)
            finally:
                os.environ.pop("WORKER_BRIDGE_POOL__SIZE", None)
                _drain(root / f"pool-waves-{mode}" / "home")
    figures = {
        "pool_task_vs_cold_ratio": tasks["ratio"],
        "pool_container_start_ms": container["pooled_ms"],
    }
    if waves:
        figures["concurrency_pool_makespan_ratio"] = waves["on"]["ratio"]
    return {"figures": figures, "tasks": tasks, "container": container, "waves": waves}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pool")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="wb-bench-pool-", dir=scratch_root()))
    try:
        print(json.dumps(bench_pool(root, args.quick), indent=2))
    finally:
        from bridge.workspace.overlay import unmount_under

        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
