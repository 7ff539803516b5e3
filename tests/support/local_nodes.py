"""A cluster of node agents in this process (bridge/pipeline/nodes.py's LocalNodes), each with
its own state root and fake engine, for the engine-free cluster tests: made, its workers'
starts hooked, and its turns' threads waited for before the test's folders go."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.waiting import poll

from bridge import WorkerBridge
from bridge.pipeline.node_agent import NodeAgent
from bridge.pipeline.nodes import LocalNodes
from bridge.sandbox import ContainerSpec
from bridge.sandbox.fake import FakeSandbox, Scripted

ROLE = "io.worker-bridge.role"


def make_nodes(
    workdir: Path,
    names: tuple[str, ...] = ("n1", "n2"),
    agent: type[NodeAgent] = NodeAgent,
    sandbox: Callable[[], FakeSandbox] = FakeSandbox,
) -> LocalNodes:
    agents = [agent(name, workdir / f"node-{name}", sandbox()) for name in names]
    return LocalNodes(agents, slots=1)


def node_sandbox(nodes: LocalNodes, name: str) -> FakeSandbox:
    found = nodes.links[name].agent.sandbox
    assert isinstance(found, FakeSandbox)
    return found


def on_worker_start(nodes: LocalNodes, name: str, act: Callable[[], None]) -> None:
    """``act`` runs when the worker's container starts on node ``name`` (the container then
    runs as it would: the mock worker as a local process)."""

    def behaviour(spec: ContainerSpec) -> Scripted | None:
        if spec.labels.get(ROLE) == "worker":
            act()
        return None

    node_sandbox(nodes, name).behaviour = behaviour


def run(bridge: WorkerBridge, spec: dict):
    return bridge.run_task(bridge.create_task(spec).task_id)


@pytest.fixture(autouse=True)
def turns_end_before_the_folders_go(workdir: Path) -> Iterator[None]:
    """A lost node's turn goes on in its thread after the test: it ends before the test's
    folders are removed under it (autouse where this module's fixtures are imported)."""
    yield
    poll(lambda: not any(t.name.startswith("turn-") for t in threading.enumerate()), "turns", 30)
