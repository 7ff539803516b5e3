"""Ray on the cluster: the head in the control namespace (no CPU of its own, so no task ever
runs on the control host) and a Ray node process per simulated node, each `ray start --block`
as the leader of its own process group, so it is stopped or killed by that group's id and
never with `ray stop`, which finds processes by name. Token authentication is on: a token the
script makes (0600) and every Ray process reads from its file, never from the environment or
~/.ray. Each node carries a resource naming it and `wb_slot`, and its processes inherit the
node's DOCKER_HOST, so a task pinned to the node uses that node's engine."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

from local_cluster import procs
from local_cluster.layout import CONTROL_IP, RAY_PORT, ClusterLayout, NodeLayout
from local_cluster.state import Proc

OBJECT_STORE_BYTES = 200 * 1000 * 1000
PROBE = Path(__file__).with_name("ray_probe.py")
SLOT_MEMORY_GIB = 4  # a worker container's memory, roughly: slots = min(cores, memory / this)


def default_slots() -> int:
    """Slots from the node's cores and memory (each simulated node sees the whole machine)."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(os.cpu_count() or 1, int(memory_gib // SLOT_MEMORY_GIB)))


def write_token(layout: ClusterLayout) -> None:
    fd = os.open(layout.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))


def environment(
    layout: ClusterLayout,
    venv: Path,
    docker_host: str | None = None,
    agent_root: Path | None = None,
) -> dict:
    """What every Ray process of the cluster (and a driver) runs with: token auth on, the
    token's file, no Ray setting inherited from the caller's environment; on a node, its
    engine and the folder of worker-bridge's agent there (WORKER_BRIDGE_NODE_HOME)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.pop("DOCKER_HOST", None)
    if agent_root is not None:  # a node's: nothing of the control host's worker-bridge
        env = {k: v for k, v in env.items() if not k.startswith("WORKER_BRIDGE_")}
        env["WORKER_BRIDGE_NODE_HOME"] = str(agent_root)
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN_PATH"] = str(layout.token_file)
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    return env


def _common(temp: Path, ip: str, name: str) -> list[str]:
    return [
        "start",
        "--block",
        "--node-ip-address",
        ip,
        "--node-name",
        name,
        "--temp-dir",
        str(temp),
        "--object-store-memory",
        str(OBJECT_STORE_BYTES),
        "--num-gpus",
        "0",
        "--disable-usage-stats",
    ]


def start_head(layout: ClusterLayout, venv: Path) -> Proc:
    argv = [str(venv / "bin" / "ray"), *_common(layout.control_ray_temp, CONTROL_IP, "control")]
    argv += ["--head", "--port", str(RAY_PORT), "--num-cpus", "0", "--include-dashboard=false"]
    return procs.spawn(
        "ray-head",
        argv,
        layout.logs / "ray-head.log",
        netns=layout.control_netns,
        env=environment(layout, venv),
    )


def start_node(layout: ClusterLayout, node: NodeLayout, venv: Path, slots: int, cpus: int) -> Proc:
    argv = [str(venv / "bin" / "ray"), *_common(node.ray_temp, node.ip, node.name)]
    resources = {node.resource: 1, "wb_slot": slots}
    argv += ["--address", layout.address, "--num-cpus", str(cpus)]
    argv += ["--resources", json.dumps(resources)]
    return procs.spawn(
        "ray",
        argv,
        layout.logs / f"{node.name}-ray.log",
        netns=node.netns,
        node=node.name,
        env=environment(layout, venv, node.docker_host, node.home / "agent"),
    )


def probe(layout: ClusterLayout, venv: Path, wait_for: list[str], timeout_s: float) -> dict:
    """The head's view of the nodes, after waiting (at most ``timeout_s``) for ``wait_for``
    to be alive: {"nodes": [...], "error": str, "missing": [...]}."""
    argv = [str(venv / "bin" / "python"), str(PROBE), layout.address]
    argv += ["--wait", ",".join(wait_for), "--timeout", str(timeout_s)]
    command = ["nsenter", f"--net=/run/netns/{layout.control_netns}", "--", *argv]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=environment(layout, venv),
        timeout=timeout_s + 60,
    )
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"nodes": [], "error": done.stderr.strip()[-2000:], "missing": wait_for}
