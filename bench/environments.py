"""Project environments on the generated Node project (tests/support/projects.py), its packages
served by the tests' own npm registry on loopback (tests/support/registries.py), the image
`worker-bridge-test/env-node` (Debian with node and npm, tests/support/env_images.py; built once
if missing, about 80 s). Everything on tmpfs (/dev/shm), each task through `WorkerBridge` in this
process (no interpreter start-up in the figures):

- floor: the task with no environment (generic mock and verify images): the mock worker writes
  one file, verification runs `test -f package.json`;
- warm: the same task with `environment` (image, `npm ci`, `setup_network: [localhost]`), the
  setup's cache already made: the task must say `environment.cached` and run no setup, or the
  benchmark stops (the figure would not be a warm one);
- cold: the first such task on a fresh state root: the worker's bundle copied out, the probe,
  `npm ci` in its own container through the task's gateway, the image commit, the cache entry.

floor and warm alternate (one warm-up floor first, the cold task warms the environment), the
ratio is the median of the per-pair ratios. At 1, 50 and 200 npm packages (8 files each, about
1 KB a file) and at 1,250 packages of 40 files (a 50,000-file node_modules, the size of a real
project's; one cold task); quick mode: 1 and 200, one pair, one cold task. What could grow with
the dependencies: the cache entry's check (a digest of its whole tree, every task, in a thread
beside the task's work), node_modules linked into the worktree and the verification checkout
(once per entry for layered checkouts), the stat baseline over it, and its removal with them.
Those steps are also timed alone, on the warm entry and (full mode) on generated trees of 20,000
and 50,000 files: what a task pays where checkouts are not layered.

`python -m bench.environments [--quick]` runs it alone (in `make bench` as `environments`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import median, scratch_root, timed
from bench.task import timed_task

TESTS = Path(__file__).resolve().parent.parent / "tests"
SETUP = "npm ci --no-audit --no-fund"
VERIFY = "test -f package.json"
MOCK = {"mock": {"script": "echo done > bench-out.txt"}}
FILES_PER_PACKAGE = 8
SYNTHETIC = (20_000, 50_000)  # files in the generated trees of full mode
LARGE = (1_250, 40)  # full mode's largest project: a 50,000-file node_modules


def _support():  # noqa: ANN202
    """tests/support (the registry, the project generator, the env image), importable."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from support import env_images, projects, registries

    return env_images, projects, registries


def base_image() -> str:
    return os.environ.get("WORKER_BRIDGE_TEST_BASE_IMAGE", "worker-bridge/rootfs:bookworm")


def _spec(repo: Path, image: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "objective": "write one file",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": [VERIFY]},
        "metadata": MOCK,
    }
    if image is not None:
        spec["environment"] = {"image": image, "setup": [SETUP], "setup_network": ["localhost"]}
    return spec


def _events(bridge, task_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        page = bridge.task_logs(task_id, after=after, limit=500)
        out.extend(e.document() for e in page.events)
        if len(page.events) < 500:
            return out
        after = page.next_after


def _run(bridge, spec: dict) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    elapsed, result = timed_task(bridge, spec)
    return elapsed, result, _events(bridge, result["task_id"])


def _kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


def _setup_completed(events: list[dict[str, Any]]) -> dict[str, Any]:
    for e in events:
        if e["kind"] == "environment.setup" and e["data"].get("status") == "completed":
            return e["data"]
    raise RuntimeError(
        "environments bench: the cold task ran no setup (no `environment.setup` completed "
        f"event; events: {sorted(set(_kinds(events)))}): the state root was not fresh"
    )


def _check_warm(task_id: str, events: list[dict[str, Any]]) -> None:
    kinds = _kinds(events)
    if "environment.cached" not in kinds or "environment.setup" in kinds:
        raise RuntimeError(
            f"environments bench: warm task {task_id} did not use the cache "
            f"(environment.cached {'present' if 'environment.cached' in kinds else 'MISSING'}, "
            f"environment.setup {'ran' if 'environment.setup' in kinds else 'absent'}); "
            "the warm figure would be invalid"
        )


def _sealed(events: list[dict[str, Any]]) -> bool:
    """Whether a warm task was given its entry's sealed view (checked by the image alone)."""
    return any(e["kind"] == "environment.cached" and e["data"].get("sealed") for e in events)


def _home(root: Path, name: str, server_port: int) -> Path:
    """A fresh state root whose gateways may reach the registry on loopback."""
    home = root / name
    home.mkdir(mode=0o700)  # a state root of its own: the bridge would warn of an open one
    config = (
        "allowed_images: ['worker-bridge-test/*']\n"
        f"gateway:\n  trusted_ranges: ['127.0.0.0/8']\n  http_ports: [{server_port}]\n"
    )
    (home / "config.yaml").write_text(config)
    return home


def cleanup_home(home: Path) -> None:
    """The state root's containers and the images it made (the setup's commits), then its
    folder."""
    from bridge.sandbox import DockerSandbox, home_id
    from bridge.workspace.fs import remove_tree

    label = f"io.worker-bridge.home={home_id(home)}"
    try:
        DockerSandbox().remove_by_labels({"io.worker-bridge.home": home_id(home)})
    except Exception:  # noqa: BLE001 - best effort, the folder still goes
        pass
    ids = subprocess.run(
        ["docker", "images", "-q", "--no-trunc", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    for image_id in dict.fromkeys(ids):
        subprocess.run(["docker", "rmi", "-f", image_id], capture_output=True)
    from bridge.workspace.overlay import unmount_under

    unmount_under(home)  # layered worktrees stay mounted until pruned
    remove_tree(home)


def _entry_outputs(home: Path, key: str) -> Path:
    from bridge.environments.cache import OUTPUTS, cache_root

    return cache_root(home) / key / OUTPUTS


def _per_task_costs(home: Path, key: str, scratch: Path, owner) -> dict[str, Any]:  # noqa: ANN001
    """The growing per-task steps measured alone on the warm entry: its check (tree digest),
    one materialization into an empty folder (a task does two: worktree and verification
    checkout), the stat baseline over it, and removing it."""
    return _measure_costs(_entry_outputs(home, key), scratch, owner)


def _measure_costs(outputs: Path, scratch: Path, owner) -> dict[str, Any]:  # noqa: ANN001
    from bridge.environments.cache import materialize
    from bridge.environments.digest import tree_digest
    from bridge.workspace.baseline import record_files
    from bridge.workspace.fs import remove_tree

    digest_s = timed(lambda: tree_digest(outputs))
    _, files, size = tree_digest(outputs)
    dest = scratch / "materialized"
    dest.mkdir()
    added: list[int] = []
    materialize_s = timed(lambda: added.append(materialize(outputs, dest, owner)))
    baseline_s = timed(lambda: record_files(dest))
    remove_s = timed(lambda: remove_tree(dest))
    return {
        "cached_files": files,
        "cached_bytes": size,
        "entries_added": added[0],
        "check_digest_s": round(digest_s, 4),
        "materialize_s": round(materialize_s, 4),
        "baseline_s": round(baseline_s, 4),
        "remove_s": round(remove_s, 4),
    }


PHASES = ("queued_s", "prepare_s", "environment_s", "worker_s", "collect_s", "verify_s")


def synthetic_costs(root: Path, files: int, owner) -> dict[str, Any]:  # noqa: ANN001
    """The same per-task steps on a sealed node_modules-like tree of ``files`` files, no npm
    involved: packages of 40 files of 1 KB (package.json, README.md, index.js, 17 in lib/, 20
    in lib/util/), side by side in node_modules/ (20,000 files: 500 packages; 50,000: 1,250),
    what a project of real size holds. A warm task with one verification command links the tree
    twice (worktree, verification checkout), takes the stat baseline once, checks the entry once
    and removes the checkout's copy (the worktree's goes at accept or prune)."""
    from bridge.environments.cache import seal
    from bridge.workspace.fs import remove_tree

    scratch = root / f"synthetic-{files}"
    outputs = scratch / "outputs"
    body = b"x" * 1024
    for p in range(max(files // 40, 1)):
        package = outputs / "node_modules" / f"pkg-{p:05d}"
        (package / "lib" / "util").mkdir(parents=True)
        for name in ("package.json", "README.md", "index.js"):
            (package / name).write_bytes(body)
        for f in range(17):
            (package / "lib" / f"part-{f}.js").write_bytes(body)
        for f in range(20):
            (package / "lib" / "util" / f"util-{f}.js").write_bytes(body)
    seal(outputs)
    try:
        costs = _measure_costs(outputs, scratch, owner)
    finally:
        remove_tree(scratch)
    costs["materialize_us_per_file"] = round(costs["materialize_s"] / costs["cached_files"] * 1e6)
    costs["remove_us_per_file"] = round(costs["remove_s"] / costs["cached_files"] * 1e6)
    costs["per_task_estimate_s"] = round(
        costs["check_digest_s"]
        + 2 * costs["materialize_s"]
        + costs["baseline_s"]
        + costs["remove_s"],
        2,
    )
    return costs


def _phases(results: list[dict[str, Any]], totals: list[float]) -> dict[str, float]:
    """Median of each phase of the tasks' own timings, and of what no phase covers (the
    materialization into the worktree and the stat baseline are between `environment` and
    `worker`; creating, finishing and cleaning up the task are outside every phase)."""
    timings = [r.get("timings", {}) for r in results]
    keys = sorted({k for t in timings for k in t})
    out = {k: round(median([t[k] for t in timings if k in t]), 3) for k in keys}
    untimed = [
        total - sum(t.get(k, 0.0) for k in PHASES) for t, total in zip(timings, totals, strict=True)
    ]
    out["outside_phases_s"] = round(median(untimed), 3)
    return out


def bench_size(
    root: Path,
    server,
    projects,
    image: str,
    size: tuple[int, int],
    pairs: int,
    cold_reps: int,
) -> dict[str, Any]:
    """One project size: cold tasks (each on a fresh state root), then floor/warm pairs on the
    last cold one's state root."""
    from bridge import WorkerBridge

    packages, files_per_package = size
    repo = projects.node_project_with_packages(
        root / f"repo-{packages}", server, packages, files_per_package=files_per_package
    )
    colds: list[dict[str, Any]] = []
    warm_home: Path | None = None
    for rep in range(cold_reps):
        home = _home(root, f"home-env-{packages}-{rep}", server.port)
        bridge = WorkerBridge(home=home)
        try:
            elapsed, result, events = _run(bridge, _spec(repo, image))
        finally:
            bridge.close()
        setup = _setup_completed(events)
        commands = [
            e["data"]["duration_s"]
            for e in events
            if e["kind"] == "environment.setup" and e["data"].get("status") == "command"
        ]
        colds.append(
            {
                "task_s": round(elapsed, 3),
                "environment_s": result["timings"].get("environment_s"),
                "setup_s": setup["duration_s"],
                "npm_ci_container_s": round(sum(commands), 3),
                "files": setup.get("files"),
                "bytes": setup.get("bytes"),
                "key": setup["key"],
                "timings": result["timings"],
            }
        )
        if rep + 1 < cold_reps:
            cleanup_home(home)  # the next cold task gets a fresh state root of its own
        else:
            warm_home = home
    assert warm_home is not None

    floor_home = _home(root, f"home-floor-{packages}", server.port)
    floor_bridge = WorkerBridge(home=floor_home)
    env_bridge = WorkerBridge(home=warm_home)
    floors, warms, ratios, floor_results, warm_results = [], [], [], [], []
    try:
        _run(floor_bridge, _spec(repo, None))  # warm-up (a new state root's first task)
        # The first cached use checks the entry whole and seals its view (one image made):
        # timed apart, as what the second task of a project pays once.
        first_warm, _, events = _run(env_bridge, _spec(repo, image))
        _check_warm("first warm", events)
        sealed = []
        for _ in range(pairs):
            f, fr, _ = _run(floor_bridge, _spec(repo, None))
            w, wr, events = _run(env_bridge, _spec(repo, image))
            _check_warm(wr["task_id"], events)
            sealed.append(_sealed(events))
            floors.append(f)
            warms.append(w)
            ratios.append(w / f)
            floor_results.append(fr)
            warm_results.append(wr)
        owner = env_bridge.context().sandbox_identity()[1]
    finally:
        floor_bridge.close()
        env_bridge.close()
    scratch = root / f"costs-{packages}"
    scratch.mkdir()
    costs = _per_task_costs(warm_home, colds[-1]["key"], scratch, owner)
    cleanup_home(floor_home)
    cleanup_home(warm_home)
    return {
        "packages": packages,
        "files_per_package": files_per_package,
        "pairs": pairs,
        "floor_median_s": round(median(floors), 3),
        "warm_median_s": round(median(warms), 3),
        "warm_vs_floor_ratio": round(median(ratios), 3),
        "warm_minus_floor_s": round(median(warms) - median(floors), 3),
        "first_warm_s": round(first_warm, 3),  # checked whole, and its view sealed
        "warm_sealed": sum(sealed),  # of the pairs' warm tasks, those given a sealed view
        "cold_task_median_s": round(median([c["task_s"] for c in colds]), 3),
        "cold_environment_median_s": round(median([c["environment_s"] for c in colds]), 3),
        "cold_setup_median_s": round(median([c["setup_s"] for c in colds]), 3),
        "cold_npm_ci_median_s": round(median([c["npm_ci_container_s"] for c in colds]), 3),
        # the environment phase besides the setup: the bundle copied out, the probe, the key
        "cold_bundle_probe_median_s": round(
            median([c["environment_s"] - c["setup_s"] for c in colds]), 3
        ),
        "floor_phases_median_s": _phases(floor_results, floors),
        "warm_phases_median_s": _phases(warm_results, warms),
        "per_task_costs": costs,
        "samples": {
            "floor_s": [round(x, 3) for x in floors],
            "warm_s": [round(x, 3) for x in warms],
            "ratios": [round(x, 3) for x in ratios],
            "cold": colds,
        },
    }


def bench_environments(
    root: Path,
    sizes: list[tuple[int, int]],
    pairs: int,
    cold_reps: int,
    *,
    synthetic: tuple[int, ...] = (),
) -> dict:
    """Every size in ``sizes`` (npm packages, files each), on a folder of ``root`` (tmpfs); the
    cold tasks of a size past 10,000 files once; the per-task
    steps alone on generated trees of each size in ``synthetic`` (files)."""
    from bridge.sandbox import DockerSandbox

    env_images, projects, registries = _support()
    t0 = time.perf_counter()
    image = env_images.node_image(DockerSandbox(), base_image())
    image_s = time.perf_counter() - t0
    work = Path(tempfile.mkdtemp(prefix="environments-", dir=root))
    server = registries.PackageServer().start()
    rows: list[dict[str, Any]] = []
    scaled: list[dict[str, Any]] = []
    try:
        for size in sizes:
            colds = cold_reps if size[0] * size[1] <= 10_000 else 1  # npm ci of 50,000 files
            row = bench_size(work, server, projects, image, size, pairs, colds)
            rows.append(row)
            costs = row["per_task_costs"]
            print(
                f"  environment, {size[0]:>4} packages ({costs['cached_files']} cached files): "
                f"floor {row['floor_median_s']:.2f} s, warm {row['warm_median_s']:.2f} s "
                f"({row['warm_vs_floor_ratio']:.2f}x), cold task {row['cold_task_median_s']:.2f} s "
                f"(setup {row['cold_setup_median_s']:.2f} s)",
                flush=True,
            )
        from bridge.config.settings import load_config

        # As a task's materialization: hard links to the sandbox user when the bridge is root.
        owner = (load_config().sandbox_uid,) * 2 if os.geteuid() == 0 else None
        scaled = [synthetic_costs(work, n, owner) for n in synthetic]
    finally:
        server.stop()
        for home in sorted(work.glob("home-*")):
            cleanup_home(home)
        from bridge.workspace.fs import remove_tree

        remove_tree(work)
    first = rows[0]
    return {
        "scratch": str(root),
        "image": image,
        "image_ready_s": round(image_s, 1),
        "pairs": pairs,
        "cold_reps": cold_reps,
        "setup": SETUP,
        "verify": VERIFY,
        "sizes": rows,
        "synthetic_trees": scaled,
        "warm_vs_floor_ratio": first["warm_vs_floor_ratio"],
        "cold_setup_s": first["cold_setup_median_s"],
    }


def print_environments(result: dict[str, Any]) -> None:
    print(
        f"\nproject environments (on {result['scratch']}, library, {result['pairs']} pairs, "
        f"cold x{result['cold_reps']}):"
    )
    print(
        f"{'packages':>8} {'files':>6} {'floor':>7} {'warm':>7} {'ratio':>6} {'+warm':>7} "
        f"{'cold task':>9} {'setup':>7} {'npm ci':>7} {'link x1':>8} {'digest':>7}"
    )
    for row in result["sizes"]:
        c = row["per_task_costs"]
        print(
            f"{row['packages']:>8} {c['cached_files']:>6} {row['floor_median_s']:>6.2f}s "
            f"{row['warm_median_s']:>6.2f}s {row['warm_vs_floor_ratio']:>6.2f} "
            f"{row['warm_minus_floor_s']:>+6.2f}s {row['cold_task_median_s']:>8.2f}s "
            f"{row['cold_setup_median_s']:>6.2f}s {row['cold_npm_ci_median_s']:>6.2f}s "
            f"{c['materialize_s'] * 1000:>6.0f}ms {c['check_digest_s'] * 1000:>5.0f}ms"
        )
    for row in result["sizes"]:
        print(
            f"  sealed at {row['packages']:>4}: {row['warm_sealed']} of {row['pairs']} warm tasks "
            f"given the sealed view; the first warm task (checked whole, sealed) "
            f"{row['first_warm_s']:.2f} s"
        )
    for row in result["sizes"]:
        f, w = row["floor_phases_median_s"], row["warm_phases_median_s"]
        keys = [*PHASES[1:], "outside_phases_s"]
        print(
            f"  floor->warm at {row['packages']:>3}: "
            + ", ".join(f"{k[:-2]} {f.get(k, 0):.2f}->{w.get(k, 0):.2f}" for k in keys)
        )
    for c in result.get("synthetic_trees") or []:
        print(
            f"  generated tree, {c['cached_files']} files: check {c['check_digest_s']:.2f} s, "
            f"link {c['materialize_s']:.2f} s ({c['materialize_us_per_file']} us/file), "
            f"baseline {c['baseline_s']:.2f} s, remove {c['remove_s']:.2f} s: "
            f"~{c['per_task_estimate_s']:.1f} s per warm task"
        )


def settings(quick: bool) -> tuple[list[tuple[int, int]], int, int]:
    """(sizes as npm packages and files in each, floor/warm pairs, cold tasks per size): quick
    is a smoke run."""
    small = [(1, FILES_PER_PACKAGE), (200, FILES_PER_PACKAGE)]
    if quick:
        return small, 1, 1
    return [small[0], (50, FILES_PER_PACKAGE), small[1], LARGE], 15, 3


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.environments")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args()
    sizes, pairs, cold_reps = settings(args.quick)
    t0 = time.perf_counter()
    result = bench_environments(
        scratch_root(),
        sizes,
        pairs,
        cold_reps,
        synthetic=() if args.quick else SYNTHETIC,
    )
    print_environments(result)
    print(f"\nwall {time.perf_counter() - t0:.1f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
