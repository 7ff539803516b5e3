"""`make bench` / `python -m bench [--quick] [--out FILE]`: run every benchmark in one go, print a
table with the floor beside each figure, and write bench/results.json.

Everything runs on tmpfs (/dev/shm): the root disk of the machines here is ext4 without a
journal, where creating many files soon after deleting many is ~20x slower. The one exception
is the whole task of a large change (bench/large_task.py), which runs on both disks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import make_repo, scratch_root
from bench.concurrency import bench_concurrency
from bench.environments import SYNTHETIC as ENV_SYNTHETIC
from bench.environments import bench_environments, print_environments
from bench.environments import settings as environment_settings
from bench.gateway import bench_gateway
from bench.jobs import bench_jobs, print_jobs
from bench.large_change import bench_large_change
from bench.large_task import bench_large_task, print_large_task
from bench.mcp import bench_mcp
from bench.objects_cache import bench_objects_cache, make_history
from bench.store_scale import bench_store
from bench.task import bench_library, bench_one_task
from bench.workers import bench_workers, print_workers

TARGETS = {
    "task_vs_floor_ratio": 1.25,
    "library_vs_floor_ratio": 1.15,
    "concurrency_makespan_ratio": 1.15,
    "store_read_p99_ms": 20.0,
    "mcp_delegate_ms": 150.0,
    "large_change_vs_floor_ratio": 1.5,
    "large_task_phase_vs_floor_ratio": 2.0,
    "compete_vs_serial_ratio": 0.6,
}


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
    from bridge.config import load_config

    config = load_config()
    images = {"mock": config.image_for("mock"), "verify": config.verify_image_ref}
    if quick:
        return bench_large_task({"tmpfs": (scratch_root(), 0.0)}, [2000], {2000: 1}, images)
    disks = {"tmpfs": (scratch_root(), 0.0), "root disk": (Path(root_disk), 30.0)}
    return bench_large_task(disks, [10_000, 100_000], {10_000: 3, 100_000: 2}, images)


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
    q = args.quick
    size = {"files": 500, "mb": 5} if q else {"files": 5000, "mb": 50}
    pairs = 2 if q else 8
    from bridge.config import load_config

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
        conc = bench_concurrency(
            root / "conc", tasks=4 if q else 8, limit=2 if q else 4, sleep=1.0 if q else 2.0
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
    finally:
        from bridge.workspace.overlay import unmount_under

        unmount_under(root)  # layered worktrees stay mounted until pruned
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(
            "docker ps -aq --filter label=io.worker-bridge.bench=1 | xargs -r docker rm -f",
            shell=True,
            capture_output=True,
        )

    results.update(
        {
            "task_vs_floor_ratio": one["ratio_median"],
            "library_vs_floor_ratio": lib["ratio_median"],
            "concurrency_makespan_ratio": conc["ratio"],
            "compete_vs_serial_ratio": results["jobs"]["ratio_median"],
            "store_read_p99_ms": store["read_p99_ms"],
            "mcp_delegate_ms": mcp["delegate_median_ms"],
            "large_change_vs_floor_ratio": results["large_change"]["ratio_largest"],
            "large_task_phase_vs_floor_ratio": results["large_task"]["phase_ratio_largest"],
            "environment_warm_vs_floor_ratio": results["environments"]["warm_vs_floor_ratio"],
            "environment_cold_setup_s": results["environments"]["cold_setup_s"],
        }
    )
    rows = [
        (
            "one task, CLI",
            f"{one['bridge_median_s']:.3f} s",
            f"{one['floor_median_s']:.3f} s",
            "task_vs_floor_ratio",
        ),
        (
            "one task, library",
            f"{lib['bridge_median_s']:.3f} s",
            f"{lib['floor_median_s']:.3f} s",
            "library_vs_floor_ratio",
        ),
        (
            f"{conc['tasks']} tasks at limit {conc['limit']}",
            f"{conc['makespan_s']:.2f} s",
            f"{conc['ideal_s']:.2f} s (ideal)",
            "concurrency_makespan_ratio",
        ),
        (
            f"compete of {results['jobs']['candidates']}",
            f"{results['jobs']['compete_median_s']:.2f} s",
            f"{results['jobs']['serial_median_s']:.2f} s (serial)",
            "compete_vs_serial_ratio",
        ),
        ("store read p99", f"{store['read_p99_ms']:.2f} ms", "-", "store_read_p99_ms"),
        ("MCP delegate median", f"{mcp['delegate_median_ms']:.1f} ms", "-", "mcp_delegate_ms"),
        (
            f"collect {results['large_change']['sizes'][-1]['files']} new files",
            f"{results['large_change']['sizes'][-1]['bridge_s']:.2f} s",
            f"{results['large_change']['sizes'][-1]['floor_s']:.2f} s",
            "large_change_vs_floor_ratio",
        ),
        (
            f"task of {results['large_task']['largest']} files, worst of collect/verify/accept",
            "",
            "",
            "large_task_phase_vs_floor_ratio",
        ),
    ]
    print(f"\n{'measure':<26} {'bridge':>12} {'floor':>18} {'figure':>10} {'target':>8}")
    for label, bridge_v, floor_v, key in rows:
        value = results[key]
        mark = "ok" if value <= TARGETS[key] else "MISSED"
        print(f"{label:<26} {bridge_v:>12} {floor_v:>18} {value:>10.3f} {TARGETS[key]:>8} {mark}")
    print(
        "\nphases (median s, CLI): "
        + ", ".join(f"{k}={v:.3f}" for k, v in one["phases_median_s"].items())
    )
    print(
        f"store: show p99 {store['show']['p99_ms']:.2f} ms, list(50) p99 "
        f"{store['list_50']['p99_ms']:.2f} ms, logs page p99 "
        f"{store['logs_page_200']['p99_ms']:.2f} ms, list all {store['list_all_median_ms']:.0f} ms"
    )
    print(f"MCP worker_status median {mcp['status_median_ms']:.1f} ms")
    print_jobs(results["jobs"])
    print_large_task(results["large_task"])
    print_workers(results["real_workers"])
    print_environments(results["environments"])
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
