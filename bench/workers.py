"""The real worker CLIs through worker-bridge, against the scripted model server (bridge/smoke)
answering at once: per worker, the time from the task's start to the CLI's first model request,
and the whole task's time over the CLI's own run (the same command line, environment and config
files in a bare `docker run` on the host's network, talking to the server directly), alternated
A B A B in one run. Workers whose image is not built are skipped and said so."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import median
from bridge.smoke.model_server import ModelServer

KEY = "sk-bench-" + os.urandom(8).hex()
OBJECTIVE = "Create the greeting file.\n@write hello.txt: hello from the bench\n@say Done."
WORKERS = ("claude-code", "codex", "opencode", "zcode-glm")


def _config_yaml(server: ModelServer) -> str:
    lines = ["gateway:", "  routes:"]
    for route, auth in (("anthropic", "x-api-key"), ("openai", "bearer"), ("zai", "bearer")):
        lines += [
            f"    {route}:",
            f"      upstream: {server.url}",
            f"      auth: {auth}",
            "      key_env: WB_BENCH_KEY",
        ]
    return "\n".join(lines) + "\n"


def _bare_run(worker, config, repo: Path, scratch: Path, server: ModelServer) -> float:
    """The CLI alone: what the worker's launch says, in a plain container on the host network,
    with the gateway's URL replaced by the server's and the placeholder by the real key."""
    from bridge.workers import HOME_DIR, INPUTS_DIR, Turn
    from bridge.workers.cli import PLACEHOLDER_KEY

    launch = worker.launch(Turn(OBJECTIVE, {}), config)
    route_url = worker.route_url(config)

    def fix(text: str) -> str:
        return text.replace(route_url, server.url).replace(PLACEHOLDER_KEY, KEY)

    run_dir = Path(tempfile.mkdtemp(dir=scratch))
    workspace, inputs, home = run_dir / "ws", run_dir / "inputs", run_dir / "home"
    subprocess.run(["git", "clone", "-q", str(repo), str(workspace)], check=True)
    inputs.mkdir()
    home.mkdir()
    for name, content in launch.files.items():
        (inputs / name).write_text(fix(content))
    mounts = ["-v", f"{workspace}:/workspace", "-v", f"{inputs}:{INPUTS_DIR}:ro"]
    mounts += ["-v", f"{home}:{HOME_DIR}"]
    for i, (rel, content) in enumerate(sorted(launch.home_files.items())):
        source = inputs / f"home-{i}"
        source.write_text(fix(content))
        (home / rel).parent.mkdir(parents=True, exist_ok=True)  # the CLI's to write in
        mounts += ["-v", f"{source}:{HOME_DIR}/{rel}:ro"]
    subprocess.run(["chown", "-R", "10001:10001", str(workspace), str(home)], check=True)
    env: list[str] = []
    for name, value in {"HOME": HOME_DIR, **launch.env}.items():
        env += ["-e", f"{name}={fix(value)}"]
    # The same CPU and memory limits a task's container gets (the defaults), so the figure is
    # what the bridge adds, not what a quota takes away.
    limits = config.limits
    cmd = ["docker", "run", "--rm", "--network", "host", "--user", "10001:10001"]
    cmd += ["--cpus", str(limits.cpus), "--memory", f"{limits.memory_mb}m"]
    cmd += ["--label", "io.worker-bridge.bench=1", "-w", "/workspace", *mounts, *env]
    cmd += [worker.image(config), *launch.command]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0 or not (workspace / "hello.txt").is_file():
        raise RuntimeError(
            f"bare {worker.name} run failed: {proc.stdout[-500:]}{proc.stderr[-500:]}"
        )
    subprocess.run(["rm", "-rf", str(run_dir)], check=False)
    return elapsed


def _bridge_run(bridge, worker_name: str, repo: Path, server: ModelServer) -> tuple[float, float]:
    """(whole task, start to the first model request) through worker-bridge."""
    spec = {
        "objective": OBJECTIVE,
        "worker": worker_name,
        "workspace": {"repository": str(repo)},
        "verification": {"commands": ["grep -q hello hello.txt"]},
    }
    seen = len(server.requests)
    t0 = time.perf_counter()
    wall0 = time.time()
    task = bridge.create_task(spec)
    result = bridge.run_task(task.task_id)
    elapsed = time.perf_counter() - t0
    if result.status != "succeeded":
        raise RuntimeError(f"bench {worker_name} task failed: {result.error}")
    first = next(r.at for r in server.requests[seen:] if r.api is not None)
    return elapsed, first - wall0


def bench_workers(root: Path, repo: Path, pairs: int) -> dict[str, Any]:
    from bridge import WorkerBridge
    from bridge.sandbox import DockerSandbox
    from bridge.workers import get_worker

    server = ModelServer(key=KEY).start()
    home = root / "home-workers"
    home.mkdir(mode=0o700)  # a state root of its own: the bridge would warn of an open one
    (home / "config.yaml").write_text(_config_yaml(server))
    os.environ["WB_BENCH_KEY"] = KEY
    out: dict[str, Any] = {"pairs": pairs, "workers": {}}
    sandbox = DockerSandbox()
    try:
        bridge = WorkerBridge(home=home)
        for name in WORKERS:
            worker = get_worker(bridge.config, name)
            if not sandbox.image_present(worker.image(bridge.config)):
                out["workers"][name] = {"skipped": f"{worker.image(bridge.config)} not built"}
                continue
            t0 = time.time()
            server_first: list[float] = []  # the bare run's start to its first request
            floors, tasks, firsts = [], [], []
            _bridge_run(bridge, name, repo, server)  # warm-up (page cache, image layers)
            for _ in range(pairs):
                seen = len(server.requests)
                start = time.time()
                floors.append(_bare_run(worker, bridge.config, repo, root, server))
                server_first.append(
                    next(r.at for r in server.requests[seen:] if r.api is not None) - start
                )
                total, first = _bridge_run(bridge, name, repo, server)
                tasks.append(total)
                firsts.append(first)
            ratios = [t / f for t, f in zip(tasks, floors, strict=True)]
            out["workers"][name] = {
                "cli_alone_median_s": round(median(floors), 3),
                "task_median_s": round(median(tasks), 3),
                "overhead_median_s": round(median(tasks) - median(floors), 3),
                "ratio_median": round(median(ratios), 3),
                "first_request_median_s": round(median(firsts), 3),
                "first_request_alone_median_s": round(median(server_first), 3),
                "wall_s": round(time.time() - t0, 1),
            }
        bridge.close()
    finally:
        server.stop()
    return out


def print_workers(result: dict[str, Any]) -> None:
    print(f"\n{'worker':<12} {'CLI alone':>10} {'task':>8} {'ratio':>6} {'1st request':>12}")
    for name, row in result["workers"].items():
        if "skipped" in row:
            print(f"{name:<12} skipped: {row['skipped']}")
            continue
        print(
            f"{name:<12} {row['cli_alone_median_s']:>9.2f}s {row['task_median_s']:>7.2f}s "
            f"{row['ratio_median']:>6.2f} {row['first_request_median_s']:>7.2f}s "
            f"(alone {row['first_request_alone_median_s']:.2f}s)"
        )
