"""`make bench` / `python -m bench [--quick] [--out FILE]`: run every benchmark in one go, print
every figure beside its goal (the goals are bench/goals.py's table) and write bench/results.json,
each figure under its goal's key beside the raw measurements.

Everything runs on tmpfs (/dev/shm): the root disk of the machines here is ext4 without a
journal, where creating many files soon after deleting many is ~20x slower. The one exception
is the whole task of a large change (bench/large_task.py), which runs on both disks.
"""

from __future__ import annotations

import argparse
import compileall
import importlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.cli_startup import bench_cli_startup, print_cli_startup
from bench.common import make_repo, scratch_root
from bench.concurrency import bench_concurrency
from bench.environments import SYNTHETIC as ENV_SYNTHETIC
from bench.environments import bench_environments, print_environments
from bench.environments import settings as environment_settings
from bench.gateway import bench_gateway
from bench.goals import print_goals
from bench.jobs import bench_jobs, print_jobs
from bench.large_change import bench_large_change
from bench.large_task import bench_large_task, print_large_task
from bench.mcp import bench_mcp
from bench.objects_cache import bench_objects_cache, make_history
from bench.store_scale import bench_store
from bench.task import bench_library, bench_one_task, bench_scale
from bench.workers import bench_workers, print_workers

# Benchmarks another module adds (its function takes the scratch root and --quick and returns
# a dict whose "figures" are merged into the results under their goals' keys): the container
# pool's effect is bench/pool.py's `bench_pool`, tasks on the simulated cluster bench/cluster.py's
# `bench_cluster` (root only). Missing modules are skipped.
OPTIONAL = (("pool", "bench.pool", "bench_pool"), ("cluster", "bench.cluster", "bench_cluster"))


def machine_line() -> str:
    engine = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True
    ).stdout.strip()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores, {mem_gib:.0f} GiB, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, Docker engine {engine}"
    )


def large_task(quick: bool, root_disk: str) -> dict:
    """The whole task of a large change beside git's floor: on tmpfs and on the root disk at
    10,000 and 100,000 files (--quick: 2,000 on tmpfs, one pair). The root disk settles 30 s
    after each sample (see bench/large_task.py)."""
    from bridge.config.settings import load_config

    config = load_config()
    images = {"mock": config.image_for("mock"), "verify": config.verify_image_ref}
    if quick:
        return bench_large_task({"tmpfs": (scratch_root(), 0.0)}, [2000], {2000: 1}, images)
    disks = {"tmpfs": (scratch_root(), 0.0), "root disk": (Path(root_disk), 30.0)}
    return bench_large_task(disks, [10_000, 100_000], {10_000: 3, 100_000: 2}, images)


def cli_startup(home: Path, runs: int) -> dict:
    """`--help`, `tasks show` and `tasks list` on a state root the CLI task filled."""
    from bridge import WorkerBridge

    bridge = WorkerBridge(home=home)
    try:
        task_id = bridge.list_tasks(limit=1)[0].task_id
    finally:
        bridge.close()
    return bench_cli_startup(home, task_id, runs)


def _warm_200(environments: dict) -> float | None:
    rows = [r for r in environments["sizes"] if r["packages"] == 200]
    return rows[0]["warm_vs_floor_ratio"] if rows else None


def _warm_50k_files(environments: dict) -> float | None:
    """A warm task at a 50,000-file node_modules (1,250 npm packages of 40 files) over the
    generic task, measured in the same pairs as the smaller sizes (--quick sets up none)."""
    rows = [r for r in environments["sizes"] if r["per_task_costs"]["cached_files"] >= 50_000]
    return rows[0]["warm_vs_floor_ratio"] if rows else None


def figures(results: dict) -> dict:
    """Each goal's figure (bench/goals.py's keys) from the measurements."""
    one, lib, scale = results["one_task_cli"], results["one_task_library"], results["scale"]
    startup = results["cli_startup"]["wall_median_ms"]
    env = results["environments"]
    return {
        "task_vs_floor_ratio": one["ratio_median"],
        "library_vs_floor_ratio": lib["ratio_median"],
        "task_50k_vs_5k_ratio": scale["ratio_median"],
        "concurrency_makespan_ratio": results["concurrency"]["ratio"],
        "environment_warm_200_vs_generic_ratio": _warm_200(env),
        "environment_warm_50k_files_vs_generic_ratio": _warm_50k_files(env),
        "task_cpu_vs_floor_ratio": one["cpu_ratio_median"],
        "cli_tasks_show_ms": startup["tasks_show"],
        "cli_tasks_list_ms": startup["tasks_list"],
        "cli_help_ms": startup["help"],
        "task_peak_rss_mb": one["peak_rss_mb"],
        "compete_vs_serial_ratio": results["jobs"]["ratio_median"],
        "store_read_p99_ms": results["store"]["read_p99_ms"],
        "mcp_delegate_ms": results["mcp"]["delegate_median_ms"],
        "large_change_vs_floor_ratio": results["large_change"]["ratio_largest"],
        "large_task_phase_vs_floor_ratio": results["large_task"]["phase_ratio_largest"],
        "environment_warm_vs_floor_ratio": env["warm_vs_floor_ratio"],
        "environment_cold_setup_s": env["cold_setup_s"],
    }


def details(results: dict) -> dict[str, str]:
    """What a figure was made of, printed beside it."""
    one, lib, scale = results["one_task_cli"], results["one_task_library"], results["scale"]
    conc, jobs, store = results["concurrency"], results["jobs"], results["store"]
    large = results["large_change"]["sizes"][-1]
    shown = {
        "task_vs_floor_ratio": f"{one['bridge_median_s']:.2f} s vs {one['floor_median_s']:.2f} s",
        "library_vs_floor_ratio": f"{lib['bridge_median_s']:.2f} s vs "
        f"{lib['floor_median_s']:.2f} s",
        "task_50k_vs_5k_ratio": f"{scale['large']['median_s']:.2f} s at {scale['large_files']:,}"
        f" vs {scale['small']['median_s']:.2f} s at {scale['small_files']:,} files",
        "concurrency_makespan_ratio": f"{conc['tasks']} tasks at {conc['limit']}: "
        f"{conc['makespan_s']:.2f} s vs {conc['ideal_s']:.2f} s",
        "task_cpu_vs_floor_ratio": f"{one['bridge_cpu_median_s']:.2f} s vs "
        f"{one['floor_cpu_median_s']:.2f} s of CPU",
        "compete_vs_serial_ratio": f"{jobs['compete_median_s']:.2f} s vs "
        f"{jobs['serial_median_s']:.2f} s",
        "large_change_vs_floor_ratio": f"{large['files']:,} files: {large['bridge_s']:.2f} s vs "
        f"{large['floor_s']:.2f} s",
        "store_read_p99_ms": "as the servers read, start-up heap frozen; a library loop: "
        f"{store['library_loop']['read_p99_ms']:.1f} ms",
    }
    for row in results["environments"]["sizes"]:
        files = row["per_task_costs"]["cached_files"]
        key = "environment_warm_200_vs_generic_ratio" if row["packages"] == 200 else None
        if files >= 50_000:
            key = "environment_warm_50k_files_vs_generic_ratio"
        if key:
            shown[key] = (
                f"{row['warm_median_s']:.2f} s vs {row['floor_median_s']:.2f} s "
                f"({files:,} cached files)"
            )
    return shown


def print_phases(results: dict) -> None:
    """Where one task's time goes (CLI; bookkeeping is what no phase covers, start-up
    included), at each size, with the CLI process's peak memory."""
    scale = results["scale"]
    rows = [
        (
            "one task, CLI",
            results["one_task_cli"]["phases_median_s"],
            results["one_task_cli"]["peak_rss_mb"],
        ),
        (
            f"at {scale['small_files']:,} files",
            scale["small"]["phases_median_s"],
            scale["small"]["peak_rss_mb"],
        ),
        (
            f"at {scale['large_files']:,} files",
            scale["large"]["phases_median_s"],
            scale["large"]["peak_rss_mb"],
        ),
    ]
    print("\nphases (median s):")
    for label, phases, rss in rows:
        shown = ", ".join(f"{k.removesuffix('_s')} {v:.3f}" for k, v in phases.items())
        print(f"  {label:<20} {shown}; peak RSS {rss} MB")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="a small smoke run for CI")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results.json"))
    parser.add_argument(
        "--root-disk",
        default="/var/tmp",
        help="a folder on the root disk for the large task's second run (default /var/tmp)",
    )
    parser.add_argument(
        "--large-repo",
        help="a large repository for the object-cache figures (default: a generated history)",
    )
    args = parser.parse_args()
    # Every command the bench starts imports compiled modules, as an installed package's do
    # (an editable install under PYTHONDONTWRITEBYTECODE would compile them on every start).
    import bridge

    compileall.compile_dir(Path(bridge.__file__).parent, quiet=1)
    q = args.quick
    size = {"files": 500, "mb": 5} if q else {"files": 5000, "mb": 50}
    pairs = 2 if q else 8
    from bridge.config.settings import load_config

    image = load_config().image_for("base")
    root = Path(tempfile.mkdtemp(prefix="wb-bench-", dir=scratch_root()))
    results: dict = {
        "machine": machine_line(),
        "quick": q,
        "scratch": str(root),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        repo = make_repo(root / "repo", size["files"], size["mb"])
        scratch = root / "floor"
        scratch.mkdir()
        print(f"machine: {results['machine']}")
        print(f"repository: {size['files']} files, {size['mb']} MB, on {root}")

        one = bench_one_task(repo, root / "home-cli", scratch, image, pairs)
        results["one_task_cli"] = one
        lib = bench_library(repo, root / "home-lib", scratch, image, pairs)
        results["one_task_library"] = lib
        results["cli_startup"] = cli_startup(root / "home-cli", 3 if q else 10)
        large_files = 2000 if q else 50_000
        large_repo = make_repo(
            root / "large-repo", large_files, size["mb"] * large_files / size["files"]
        )
        results["scale"] = {
            "small_files": size["files"],
            "large_files": large_files,
            **bench_scale(repo, large_repo, root / "home-scale", 1 if q else 4, warm_up=not q),
        }
        shutil.rmtree(large_repo, ignore_errors=True)
        conc = bench_concurrency(
            root / "conc",
            tasks=4 if q else 8,
            limit=2 if q else 4,
            sleep=1.0 if q else 2.0,
            bursts=1 if q else 3,
        )
        results["concurrency"] = conc
        results["jobs"] = bench_jobs(root, sleep=1.0 if q else 2.0, pairs=1 if q else 3)
        store = bench_store(
            root,
            tasks=1000 if q else 10_000,
            events=100_000 if q else 1_000_000,
            samples=100 if q else 500,
        )
        results["store"] = store
        mcp = bench_mcp(root, make_repo(root / "mcp-repo", 20, 0.1), 3 if q else 10, 20)
        results["mcp"] = mcp
        sizes = [1000, 5000] if q else [1000, 10_000, 100_000]
        results["large_change"] = bench_large_change(repo, root, sizes)
        results["large_task"] = large_task(q, args.root_disk)
        if args.large_repo:
            large = root / "large-repo"
            subprocess.run(
                [
                    "git",
                    "clone",
                    "-q",
                    "--no-hardlinks",
                    "--no-checkout",
                    args.large_repo,
                    str(large),
                ],
                check=True,
            )
        else:
            large = make_history(root / "history", 300 if q else 5000, 200 if q else 2000)
        results["objects_cache"] = bench_objects_cache(large, root)
        results["gateway"] = bench_gateway(50 if q else 500)
        results["real_workers"] = bench_workers(
            root, make_repo(root / "workers-repo", 20, 0.1), 1 if q else 5
        )
        env_sizes, env_pairs, env_cold = environment_settings(q)
        results["environments"] = bench_environments(
            root,
            env_sizes,
            env_pairs,
            env_cold,
            synthetic=() if q else ENV_SYNTHETIC,
        )
        for name, module, function in OPTIONAL:
            try:
                run = getattr(importlib.import_module(module), function)
            except ImportError:
                continue
            results[name] = run(root, q)
    finally:
        from bridge.workspace.overlay import unmount_under

        unmount_under(root)  # layered worktrees stay mounted until pruned
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(
            "docker ps -aq --filter label=io.worker-bridge.bench=1 | xargs -r docker rm -f",
            shell=True,
            capture_output=True,
        )

    results.update(figures(results))
    for name, _, _ in OPTIONAL:
        results.update((results.get(name) or {}).get("figures", {}))
    print_goals(results, details(results))
    print_phases(results)
    print(
        f"store: show p99 {store['show']['p99_ms']:.2f} ms, list(50) p99 "
        f"{store['list_50']['p99_ms']:.2f} ms, logs page p99 "
        f"{store['logs_page_200']['p99_ms']:.2f} ms, list all {store['list_all_median_ms']:.0f} ms"
    )
    print(f"MCP worker_status median {mcp['status_median_ms']:.1f} ms")
    print_cli_startup(results["cli_startup"])
    print_jobs(results["jobs"])
    if "cluster" in results:
        from bench.cluster import print_cluster

        print_cluster(results["cluster"])
    print_large_task(results["large_task"])
    print_workers(results["real_workers"])
    print_environments(results["environments"])
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
