"""The cluster as `worker-bridge cluster status` shows it: each node with its address, whether
it is alive, its slots in use out of its total, and the images its engine holds. A function of
the context, not of the CLI, so the MCP server and the web view can show the same."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from bridge.cluster.link import NodeInfo, Nodes, slot_scope
from bridge.errors import BridgeError

if TYPE_CHECKING:
    from bridge.store import Store

NOT_CONFIGURED = (
    "No cluster is configured: set cluster.address in config.yaml "
    "(or WORKER_BRIDGE_CLUSTER__ADDRESS) to the Ray head's HOST:PORT."
)
MOST_AT_ONCE = 16  # nodes asked for their images at the same time


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


def cluster_status(nodes: Nodes, store: Store) -> list[NodeStatus]:
    """Every node of the cluster, by name. Slots in use are the live leases of each node's
    scope in this host's ``store``: what this control host's tasks hold there now."""
    listed = nodes.nodes()
    in_use = Counter(lease["scope"] for lease in store.leases.live())
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
