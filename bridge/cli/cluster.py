"""The CLI's commands about the cluster (docs/cluster.md): `cluster status` on the control host,
`node start` and `node stop` on a machine that joins it as a node."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from bridge.cli.render import one_line, out_json
from bridge.service import WorkerBridge

SHORT_ID = 12  # an image id as `docker images` shows it
INDENT = " " * 16  # under the node's name
WIDTH = 100


def cmd_cluster_status(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    nodes = bridge.cluster_status()
    if args.json:
        out_json([node.document() for node in nodes])
        return 0
    if not nodes:
        print(f"no nodes in the cluster at {bridge.config.cluster.address}")
    for node in nodes:
        state = "alive" if node.alive else "dead"
        slots = f"{node.slots_in_use}/{node.slots} slots"
        held = "images unknown" if node.images is None else f"{len(node.images)} image(s)"
        print(f"{node.name:<15} {node.address:<21} {state:<5} {slots:<12} {held}")
        if node.images:
            ids = ", ".join(i.removeprefix("sha256:")[:SHORT_ID] for i in node.images)
            print(textwrap.fill(ids, WIDTH, initial_indent=INDENT, subsequent_indent=INDENT))
        if node.error:
            print(f"{INDENT}{one_line(node.error)}")
    return 0


def cmd_node_start(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    started = bridge.start_node(
        args.address,
        name=args.name,
        slots=args.slots,
        docker_host=args.docker_host,
        root=Path(args.root) if args.root else None,
        insecure_no_token=args.insecure_no_token,
    )
    print(
        f"node {started.name} started (pid {started.pid}): joining {started.address} with "
        f"{started.slots} slot(s); its log: {started.log}"
    )
    print("check it with `worker-bridge cluster status` on the control host")
    return 0


def cmd_node_stop(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    stopped = bridge.stop_node(args.name, Path(args.root) if args.root else None)
    if not stopped.was_running:
        print(f"node {stopped.name} (pid {stopped.pid}) was not running; its record is removed")
    elif stopped.killed:
        print(f"node {stopped.name} stopped (pid {stopped.pid}): killed, TERM did not end it")
    else:
        print(f"node {stopped.name} stopped (pid {stopped.pid})")
    return 0
