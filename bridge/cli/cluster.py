"""The CLI's commands about the cluster (docs/cluster.md): `cluster status` on the control
host."""

from __future__ import annotations

import argparse
import textwrap

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
