"""The cluster as `worker-bridge cluster status` shows it: each node with its address, whether
it is alive, its slots in use out of its total, and the images its engine holds. A function of
the context, not of the CLI, so the MCP server and the web view can show the same."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from bridge.errors import BridgeError, ConfigError

if TYPE_CHECKING:
    from bridge.cluster.nodes import NodeInfo, Nodes
    from bridge.phase.context import Context

NOT_CONFIGURED = (
    "No cluster is configured: set cluster.address in config.yaml "
    "(or WORKER_BRIDGE_CLUSTER__ADDRESS) to the Ray head's HOST:PORT."
)
MOST_AT_ONCE = 16  # nodes asked for their images at the same time


def slot_scope(node: str) -> str:
    """The lease scope of one node's slots: the same as bridge/pipeline/node_turn.py's, which
    takes them (a test keeps the two equal; the pipeline sits above this package)."""
    return f"node:{node}"


@dataclass(frozen=True)
class NodeStatus:
    """One node of the cluster. ``images``: the ids of worker-bridge's images its engine holds,
    or None when that is unknown (the node is dead, or its agent did not answer: ``error``
    says why)."""

    name: str
    address: str
    alive: bool
    slots: int
    slots_in_use: int
    images: list[str] | None
    error: str | None = None

    def document(self) -> dict[str, Any]:
        return asdict(self)


def cluster_status(ctx: Context) -> list[NodeStatus]:
    """Every node of the configured cluster, by name. ConfigError (one sentence) when no
    cluster is configured. Slots in use are the live leases of each node's scope in this
    host's store: what this control host's tasks hold there now."""
    nodes = ctx.cluster()
    if nodes is None:
        raise ConfigError(NOT_CONFIGURED)
    listed = nodes.nodes()
    in_use = Counter(lease["scope"] for lease in ctx.store.leases.live())
    if not listed:
        return []
    # Each agent's answer is bounded in time (cluster.node_timeout_s); asked side by side, a
    # silent node costs the command that bound once, not once per node.
    with ThreadPoolExecutor(min(MOST_AT_ONCE, len(listed)), "cluster-status") as pool:
        images = list(pool.map(lambda node: _images(nodes, node), listed))
    return [
        NodeStatus(
            name=node.name,
            address=node.address,
            alive=node.alive,
            slots=node.slots,
            slots_in_use=in_use.get(slot_scope(node.name), 0),
            images=held,
            error=error,
        )
        for node, (held, error) in zip(listed, images, strict=True)
    ]


def _images(nodes: Nodes, node: NodeInfo) -> tuple[list[str] | None, str | None]:
    """The node's images, or None and why not. A dead node is not asked."""
    if not node.alive:
        return None, None
    try:
        return list(nodes.agent(node.name).images()), None
    except BridgeError as exc:  # NodeLost: it did not answer in time
        return None, exc.message
