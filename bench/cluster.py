"""Tasks on the simulated cluster (issue 44) beside the same tasks on this host alone.

`bench_cluster(root, quick)` brings up `scripts/local-cluster up 2 --slots 2` (scratch on
/dev/shm), runs this module as a driver in the cluster's control namespace (`local-cluster run
-- python -m bench.cluster drive ...`: worker-bridge is the control host there, the nodes are
Ray nodes each with its own engine), and takes the cluster down. The driver measures:

- one task (mock worker writing one file, `true` as the check) through a node against the same
  task run here, alternating, at 5,000 files with the node's copy of the base already there:
  the median of each and their difference (goal: at most +0.15 s);
- the base's first transfer to a node and a cached one at 50,000 files (quick: 5,000): the
  first task on a new base against the second on the same base, the bundle's size;
- 8 tasks whose worker sleeps 2 s on 2 nodes x 2 slots against 1 node x 2 slots (the other
  node killed by pid for that arm): makespan ratio (goal: at most 0.55);
- how long a process takes to join the cluster as a Ray driver (`ray_join_s`): what every
  process running tasks (a CLI, the MCP server, each detached runner) pays once.

Needs root and the cluster's tools (`make test-deps`, `make install`); without them the result
says why and has no figures."""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local-cluster"
MARK = "WB-BENCH-RESULT "
SCRATCH = Path("/dev/shm/wbc") if Path("/dev/shm").is_dir() else Path("/var/tmp/wbc")


def _spec(repo: Path, mock: dict, verify: list[str]) -> dict:
    return {
        "objective": "bench",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": verify},
        "metadata": {"mock": mock},
    }


def _timed(bridge, spec: dict) -> tuple[float, dict]:  # noqa: ANN001
    began = time.perf_counter()
    result = bridge.run_task(bridge.create_task(spec).task_id)
    took = time.perf_counter() - began
    if result.status != "succeeded":
        raise RuntimeError(f"bench task {result.status}: {result.error}")
    return took, result.timings


def drive(work: Path, quick: bool, kill: list[str]) -> dict:
    """The driver's measurements (in the control namespace, the cluster configured by env)."""
    from bench.common import make_repo
    from bridge import WorkerBridge
    from bridge.pipeline.nodes import cluster_nodes

    limits = {"max_concurrency": 8, "repo_concurrency": 8}
    on = WorkerBridge(home=work / "cluster-home", **limits)
    off = WorkerBridge(home=work / "local-home", cluster={"address": None}, **limits)
    out: dict = {}
    began = time.perf_counter()
    cluster_nodes(on.config.cluster)  # this process joins the cluster: each runner's first cost
    out["ray_join_s"] = round(time.perf_counter() - began, 3)
    try:
        repo = make_repo(work / "repo-5k", 5000, 20)
        spec = _spec(repo, {"write": {"new.txt": "x\n"}}, ["true"])
        _timed(on, spec)  # the images and the base onto the node
        _timed(off, spec)
        pairs = 2 if quick else 5
        cluster, local = [], []
        for i in range(pairs):
            first, second = (on, off) if i % 2 == 0 else (off, on)
            a, _ = _timed(first, spec)
            b, _ = _timed(second, spec)
            (cluster if first is on else local).append(a)
            (local if first is on else cluster).append(b)
        out["one_task"] = {
            "files": 5000,
            "cluster_s": [round(x, 3) for x in cluster],
            "local_s": [round(x, 3) for x in local],
            "cluster_median_s": round(statistics.median(cluster), 3),
            "local_median_s": round(statistics.median(local), 3),
        }
        big = 5000 if quick else 50_000
        repo_big = make_repo(work / f"repo-{big}", big, 50)
        spec_big = _spec(repo_big, {"write": {"new.txt": "x\n"}}, ["true"])
        first_s, first_t = _timed(on, spec_big)
        cached_s, cached_t = _timed(on, spec_big)
        bundles = list((work / "cluster-home" / "bundles").glob("*.bundle"))
        out["base_transfer"] = {
            "files": big,
            "first_task_s": round(first_s, 3),
            "cached_task_s": round(cached_s, 3),
            "first_worker_s": first_t.get("worker_s"),
            "cached_worker_s": cached_t.get("worker_s"),
            "bundle_bytes": max((b.stat().st_size for b in bundles), default=0),
        }
        sleepy = _spec(repo, {"sleep": 2, "write": {"s.txt": "x\n"}}, [])
        _makespan(on, sleepy, 4)  # every node holds the images and the base: warm
        out["makespan"] = {"two_nodes_s": _makespan(on, sleepy, 8)}
        for node in kill:
            subprocess.run(
                [sys.executable, str(SCRIPT), *_cluster_args(), "kill", node], check=True
            )
        nodes = cluster_nodes(on.config.cluster)
        deadline = time.monotonic() + 60
        while any(n.alive for n in nodes.nodes() if n.name in kill):  # Ray's view
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kill} still alive a minute after the kill")
            time.sleep(0.2)
        out["makespan"]["one_node_s"] = _makespan(on, sleepy, 8)
    finally:
        on.close()
        off.close()
    return out


def _makespan(bridge, spec: dict, count: int) -> float:  # noqa: ANN001
    ids = [bridge.create_task(spec).task_id for _ in range(count)]
    began = time.perf_counter()
    threads = [threading.Thread(target=bridge.run_task, args=(t,)) for t in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - began
    results = [bridge.get_task(t) for t in ids]
    bad = [(r.status, r.error) for r in results if r.status != "succeeded"]
    if bad:
        raise RuntimeError(f"makespan tasks ended {bad}")
    return round(took, 3)


def _cluster_args() -> list[str]:
    state = Path(os.environ["WB_CLUSTER_STATE"])
    return ["--name", state.parent.name, "--scratch-root", str(state.parent.parent)]


def bench_cluster(root: Path, quick: bool) -> dict:
    """Bring the cluster up, drive, take it down; the figures under their goals' keys."""
    if os.geteuid() != 0:
        return {"skipped": "the simulated cluster needs root"}
    name = f"wbb{secrets.token_hex(3)}"
    base = [sys.executable, str(SCRIPT), "--name", name, "--scratch-root", str(SCRATCH)]
    base += ["--venv", sys.prefix]
    work = root / "cluster"
    work.mkdir(parents=True, exist_ok=True)
    up = subprocess.run([*base, "up", "2", "--slots", "2"], capture_output=True, text=True)
    try:
        if up.returncode != 0:
            return {"skipped": f"local-cluster up failed: {up.stderr[-500:]}"}
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        argv = [*base, "run", "--", sys.executable, "-m", "bench.cluster", "drive", str(work)]
        argv += ["--kill", "n2"] + (["--quick"] if quick else [])
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
        if MARK not in done.stdout:
            return {"skipped": f"the driver failed: {done.stderr[-1500:]}"}
        found = json.loads(done.stdout.rpartition(MARK)[2].splitlines()[0])
    finally:
        subprocess.run([*base, "down"], capture_output=True, text=True)
    one, span = found["one_task"], found["makespan"]
    found["figures"] = {
        "cluster_task_overhead_s": round(one["cluster_median_s"] - one["local_median_s"], 3),
        "cluster_makespan_ratio": round(span["two_nodes_s"] / span["one_node_s"], 3),
    }
    return found


def print_cluster(found: dict) -> None:
    if "figures" not in found:
        print(f"cluster: skipped ({found.get('skipped')})")
        return
    one, base, span = found["one_task"], found["base_transfer"], found["makespan"]
    print(
        f"cluster: one task {one['cluster_median_s']:.2f} s on a node vs "
        f"{one['local_median_s']:.2f} s here ({one['files']} files); base at {base['files']} "
        f"files: first task "
        f"{base['first_task_s']:.2f} s, cached {base['cached_task_s']:.2f} s, bundle "
        f"{base['bundle_bytes'] / 1e6:.1f} MB; 8 x 2 s tasks: 2 nodes {span['two_nodes_s']:.2f} s,"
        f" 1 node {span['one_node_s']:.2f} s; joining the cluster {found['ray_join_s']:.2f} s"
    )


def main() -> int:
    if sys.argv[1:2] == ["drive"]:
        work = Path(sys.argv[2])
        quick = "--quick" in sys.argv
        kill = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--kill"]
        print(f"\n{MARK}{json.dumps(drive(work, quick, kill))}", flush=True)
        return 0
    import shutil
    import tempfile

    from bridge.workspace.overlay import unmount_under

    root = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        found = bench_cluster(root, "--quick" in sys.argv)
    finally:
        unmount_under(root)  # layered worktrees stay mounted until pruned
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(found, indent=2))
    print_cluster(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
