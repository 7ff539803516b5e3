"""What the control host's pipeline sees of a cluster (bridge/pipeline/nodes.py has the two
kinds: the nodes of a Ray cluster, and node agents in this process for the tests): the nodes,
alive or not with their slots, and a link to each node's agent, every call bounded in time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bridge.cluster.orders import ChecksOrder, TurnOrder, Update
from bridge.errors import BridgeError

NODE_RESOURCE = "wb_node:"  # a node's Ray resource naming it: wb_node:NAME
SLOT_RESOURCE = "wb_slot"  # its slots


def node_root(name: str) -> Path:
    """The agent's folder on its node: WORKER_BRIDGE_NODE_HOME (`worker-bridge node start`
    and scripts/local-cluster set it), else a folder of this user's."""
    given = os.environ.get("WORKER_BRIDGE_NODE_HOME")
    if given:
        return Path(given)
    if os.geteuid() == 0:
        return Path("/var/lib/worker-bridge-node") / name
    return Path.home() / ".local" / "share" / "worker-bridge-node" / name


def slot_scope(node: str) -> str:
    """The lease scope of one node's slots (their limit: the node's `wb_slot`)."""
    return f"node:{node}"


class NodeLost(BridgeError):
    """A node stopped answering during a task's turn (killed, cut off, or its agent died)."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(message, kind="node_lost")
        self.node = node


class NodeOverdue(BridgeError):
    """A node went on with a task's turn past the task's deadline and the node timeout it had
    to end it: it is told to cancel it, and not waited for any longer."""

    def __init__(self, node: str, phase: str) -> None:
        super().__init__(
            f"Node {node} went on past the task's deadline while {phase}.", kind="timeout"
        )
        self.node, self.phase = node, phase


@dataclass(frozen=True)
class NodeInfo:
    name: str
    address: str
    alive: bool
    slots: int


class AgentLink(Protocol):
    """What the control host asks of one node's agent (the same methods as NodeAgent's, each
    bounded in time; NodeLost when the node does not answer)."""

    def missing(self, repo_key: str, commits: list[str]) -> list[str]: ...

    def touch(self, task_id: str) -> str: ...

    def cancel(self, task_id: str) -> None: ...

    def release(self, task_id: str) -> None: ...

    def reap(self) -> list[str]: ...

    def images(self) -> list[str]: ...

    def has_image(self, reference: str, image_id: str) -> bool: ...

    def image_part(self, upload: str, index: int, data: bytes) -> None: ...

    def image_done(self, upload: str, reference: str, image_id: str) -> None: ...

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        """The turn's updates; NodeLost when none comes for ``timeout_s``."""
        ...

    def run_checks(self, order: ChecksOrder, timeout_s: float) -> Iterator[Update]:
        """The checks' updates, as a turn's."""
        ...


class Nodes(Protocol):
    def nodes(self) -> list[NodeInfo]: ...

    def agent(self, node: str) -> AgentLink: ...

    def relay_host(self) -> str:
        """The address the nodes reach this host on."""
        ...
