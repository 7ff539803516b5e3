"""`scripts/local-cluster`: the commands. `up N` prints the address to use (HOST:PORT) on
stdout and its progress on stderr; `down` takes everything away and is safe to repeat;
`status` reads and asks, never changes anything; `kill NODE` / `start NODE` crash a node (its
processes, by pid) and bring it back; `cut NODE` / `join NODE` take its link down and up;
`run -- CMD` runs CMD as the control host (in the control namespace, with the address and the
token's file in its environment); `reap` takes down the clusters whose owner process ended."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from local_cluster import bringup, engines, network, procs, ray_nodes, teardown
from local_cluster.layout import SCRATCH_ROOT, ClusterLayout, netns_path, node_index
from local_cluster.state import State

REPOSITORY = Path(__file__).resolve().parents[2]
DEFAULT_NAME = os.environ.get("WB_CLUSTER_NAME", "wbc")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="local-cluster", description=__doc__)
    parser.add_argument("--name", default=DEFAULT_NAME, help="the cluster's name (default: wbc)")
    parser.add_argument("--scratch-root", type=Path, default=SCRATCH_ROOT)
    parser.add_argument(
        "--venv", type=Path, default=REPOSITORY / ".venv", help="where Ray is installed"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="make N simulated nodes")
    up.add_argument("count", type=int)
    up.add_argument("--slots", type=int, help="wb_slot per node (default: cores and memory)")
    up.add_argument("--no-ray", action="store_true", help="engines only")
    up.add_argument("--no-registry", action="store_true")
    up.add_argument("--owner-pid", type=int, help="`reap` takes the cluster down once it ends")
    commands.add_parser("down", help="stop and remove everything of the cluster")
    status = commands.add_parser("status", help="each node: address, alive, engine, images")
    status.add_argument("--json", action="store_true")
    for verb, text in [
        ("kill", "SIGKILL every process of a node (engine, shims, containers, Ray)"),
        ("start", "start a killed node again"),
        ("cut", "take the node's link to the hub down"),
        ("join", "bring the node's link to the hub up again"),
    ]:
        commands.add_parser(verb, help=text).add_argument("node")
    run = commands.add_parser("run", help="run a command as the control host (or on --node)")
    run.add_argument("--node")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    commands.add_parser("reap", help="take down every cluster whose owner process ended")
    return parser


def _loaded(layout: ClusterLayout) -> State:
    state = State.load(layout.state_file)
    if state is None:
        raise SystemExit(f"no cluster {layout.name!r} (no {layout.state_file})")
    return state


def cmd_up(layout: ClusterLayout, args: argparse.Namespace) -> int:
    options = bringup.Options(
        count=args.count,
        slots=args.slots,
        ray=not args.no_ray,
        registry=not args.no_registry,
        venv=args.venv,
        owner_pid=args.owner_pid,
    )
    if not 1 <= args.count <= 200:
        raise SystemExit("up N: N from 1 to 200")
    began = time.monotonic()
    state = bringup.up(layout, options)
    bringup.say(
        f"cluster {layout.name!r} up in {time.monotonic() - began:.1f} s;"
        f" state: {layout.state_file}"
    )
    print(state.address or "")
    return 0


def cmd_down(layout: ClusterLayout, args: argparse.Namespace) -> int:
    began = time.monotonic()
    problems = teardown.down(layout, State.load(layout.state_file))
    for problem in problems:
        bringup.say(f"down: {problem}")
    if not problems:
        bringup.say(f"cluster {layout.name!r} down in {time.monotonic() - began:.1f} s")
    return 1 if problems else 0


def describe(layout: ClusterLayout, state: State, venv: Path) -> dict:
    """What `status` shows: read from the state, the engines and the Ray head, changing nothing."""
    seen = {"nodes": [], "error": "no Ray"}
    if state.ray and state.address and netns_path(state.control_netns).exists():
        seen = ray_nodes.probe(layout, venv, [], 10)
    ray_alive = {n["name"] for n in seen["nodes"] if n["alive"]}
    nodes = []
    for node in state.nodes:
        engine = engines.describe(Path(node.docker_host.removeprefix("unix://")))
        running = [p.role for p in state.of_node(node.name) if procs.is_running(p)]
        nodes.append(
            {
                "name": node.name,
                "address": node.ip,
                "alive": engine is not None and (node.name in ray_alive or not state.ray),
                "ray": node.name in ray_alive,
                "processes": running,
                "docker_host": node.docker_host,
                "engine": engine["version"] if engine else None,
                "images": engine["images"] if engine else [],
                "resource": node.resource,
                "slots": node.slots,
            }
        )
    own = [p.role for p in state.of_node(None) if procs.is_running(p)]
    return {
        "name": state.name,
        "address": state.address,
        "ready": state.ready,
        "registry": {"control": state.registry_push, "nodes": state.registry_pull},
        "token_file": state.token_file,
        "control_netns": state.control_netns,
        "processes": own,
        "ray_error": seen["error"],
        "nodes": nodes,
    }


def cmd_status(layout: ClusterLayout, args: argparse.Namespace) -> int:
    report = describe(layout, _loaded(layout), args.venv)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"cluster {report['name']}: address {report['address'] or '-'},"
        f" registry {report['registry']['control'] or '-'}"
    )
    for node in report["nodes"]:
        images = ", ".join(
            (i["references"][0] if i["references"] else "<none>") + f" {i['id'][7:19]}"
            for i in node["images"]
        )
        print(
            f"  {node['name']}  {node['address']:<13} {'alive' if node['alive'] else 'DOWN':<5}"
            f"  engine {node['engine'] or '-':<10} images: {images or '-'}"
        )
    return 0


def cmd_kill(layout: ClusterLayout, args: argparse.Namespace) -> int:
    state = _loaded(layout)
    state.node(args.node)
    left = teardown.kill_processes(layout, state, args.node)
    state.forget(state.of_node(args.node))
    state.save(layout.state_file)
    if left:
        bringup.say(f"kill: still running: {procs.described(left)}")
    return 1 if left else 0


def cmd_start(layout: ClusterLayout, args: argparse.Namespace) -> int:
    state = _loaded(layout)
    state.node(args.node)
    began = time.monotonic()
    bringup.start_node(layout, state, args.node, args.venv)
    bringup.say(f"{args.node} started in {time.monotonic() - began:.1f} s")
    return 0


def cmd_link(layout: ClusterLayout, args: argparse.Namespace) -> int:
    state = _loaded(layout)
    state.node(args.node)
    network.set_link(layout, f"v{args.node}", up=args.command == "join")
    return 0


def cmd_run(layout: ClusterLayout, args: argparse.Namespace) -> int:
    state = _loaded(layout)
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise SystemExit("run: a command to run, after --")
    docker_host = state.node(args.node).docker_host if args.node else None
    env = ray_nodes.environment(layout, args.venv, docker_host)
    env["RAY_ADDRESS"] = state.address or ""
    env["WB_CLUSTER_STATE"] = str(layout.state_file)
    if not args.node:  # the control host: worker-bridge's tasks go to this cluster
        env.setdefault("WORKER_BRIDGE_CLUSTER__ADDRESS", state.address or "")
        if state.registry_push:  # unless the caller said otherwise ("": none)
            env.setdefault("WORKER_BRIDGE_CLUSTER__REGISTRY", state.registry_push)
            env.setdefault("WORKER_BRIDGE_CLUSTER__NODE_REGISTRY", state.registry_pull or "")
    netns = state.node(args.node).netns if args.node else state.control_netns
    os.execvpe("nsenter", ["nsenter", f"--net={netns_path(netns)}", "--", *argv], env)
    return 127  # not reached


def cmd_reap(layout: ClusterLayout, args: argparse.Namespace) -> int:
    failed = 0
    for path in sorted(args.scratch_root.glob("*/state.json")):
        state = State.load(path)
        if state is None or state.owner_pid is None:
            continue
        if procs.start_time(state.owner_pid) == state.owner_start:
            continue  # its owner still runs
        bringup.say(f"reap: cluster {state.name!r} (owner {state.owner_pid} ended)")
        other = ClusterLayout(state.name, args.scratch_root)
        failed += bool(teardown.down(other, state))
    return 1 if failed else 0


COMMANDS = {
    "up": cmd_up,
    "down": cmd_down,
    "status": cmd_status,
    "kill": cmd_kill,
    "start": cmd_start,
    "cut": cmd_link,
    "join": cmd_link,
    "run": cmd_run,
    "reap": cmd_reap,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        layout = ClusterLayout(args.name, args.scratch_root)
        if getattr(args, "node", None):
            node_index(args.node)
        return COMMANDS[args.command](layout, args)
    except (RuntimeError, ValueError, KeyError, OSError) as exc:
        print(f"local-cluster {args.command}: {exc}", file=sys.stderr)
        return 1
