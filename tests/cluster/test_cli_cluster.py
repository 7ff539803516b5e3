"""The cluster's commands without an engine or Ray: `cluster status` over node agents in this
process (each a fake sandbox of its own), and its one sentence without a cluster."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from bridge import WorkerBridge
from bridge.cli.cluster import cmd_cluster_status
from bridge.cluster.agent import NodeAgent
from bridge.cluster.nodes import LocalNodes, NodeInfo
from bridge.cluster.status import NOT_CONFIGURED, cluster_status, slot_scope
from bridge.errors import ConfigError
from bridge.sandbox.fake import FakeSandbox
from bridge.sandbox.spec import ImageInfo
from bridge.store.owners import Owner


def the_error_line(result, code: int, *mentions: str) -> str:
    assert result.code == code, (result.code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for text in mentions:
        assert text in lines[0], lines[0]
    return lines[0]


# -- cluster status -----------------------------------------------------------------------------


class Holding(FakeSandbox):
    """A fake engine holding the given images."""

    def __init__(self, *ids: str) -> None:
        super().__init__()
        self.ids = ids

    def images(self, labels: dict[str, str]) -> list[ImageInfo]:
        return [ImageInfo(id=i, labels={}, env={}) for i in self.ids]


class AllAlive(LocalNodes):
    """Nodes Ray still lists as alive, whose agents may not answer all the same."""

    def nodes(self) -> list[NodeInfo]:
        return [replace(node, alive=True) for node in super().nodes()]


@pytest.fixture
def agents(workdir: Path) -> dict[str, NodeAgent]:
    engines = {"n1": Holding("sha256:" + "a" * 64, "sha256:" + "b" * 64), "n2": Holding()}
    return {name: NodeAgent(name, workdir / f"node-{name}", e) for name, e in engines.items()}


def on_cluster(home: Path, nodes: LocalNodes) -> WorkerBridge:
    return WorkerBridge(home=home, sandbox=FakeSandbox(), nodes=nodes)


def test_cluster_status_shows_each_node_its_slots_in_use_and_its_images(home, agents, capsys):
    nodes = LocalNodes(list(agents.values()), slots=2)
    nodes.links["n2"].down.set()  # a dead node: not asked, its images unknown
    bridge = on_cluster(home, nodes)
    try:
        assert bridge.store.leases.acquire("t1", Owner(), {slot_scope("n1"): 2}, 60)
        assert cmd_cluster_status(bridge, argparse.Namespace(json=True)) == 0
    finally:
        bridge.close()
    shown = json.loads(capsys.readouterr().out)
    assert shown == [
        {
            "name": "n1",
            "address": "in-process",
            "alive": True,
            "slots": 2,
            "slots_in_use": 1,
            "images": ["sha256:" + "a" * 64, "sha256:" + "b" * 64],
            "error": None,
        },
        {
            "name": "n2",
            "address": "in-process",
            "alive": False,
            "slots": 2,
            "slots_in_use": 0,
            "images": None,
            "error": None,
        },
    ]


def test_cluster_status_as_a_table_names_each_node_with_a_line_of_its_image_ids(
    home, agents, capsys
):
    bridge = on_cluster(home, LocalNodes(list(agents.values()), slots=3))
    try:
        assert cmd_cluster_status(bridge, argparse.Namespace(json=False)) == 0
    finally:
        bridge.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["n1", "in-process", "alive", "0/3", "slots", "2", "image(s)"]
    assert lines[1].split() == ["a" * 12 + ",", "b" * 12]
    assert lines[2].split() == ["n2", "in-process", "alive", "0/3", "slots", "0", "image(s)"]


def test_a_node_whose_agent_does_not_answer_shows_its_images_unknown_and_why(home, agents):
    nodes = AllAlive(list(agents.values()))
    nodes.links["n1"].down.set()
    bridge = on_cluster(home, nodes)
    try:
        n1, n2 = cluster_status(bridge.context())
    finally:
        bridge.close()
    assert n1.alive and n1.images is None and n1.error == "Node n1 does not answer."
    assert n2.images == [] and n2.error is None


def test_cluster_status_without_a_cluster_is_one_sentence_and_exit_2(cli, workdir, monkeypatch):
    monkeypatch.delenv("WORKER_BRIDGE_CLUSTER__ADDRESS", raising=False)
    line = the_error_line(cli("cluster", "status", "--json"), 2, "cluster.address")
    assert line == f"worker-bridge: {NOT_CONFIGURED}"
    home = workdir / "no-home"
    with pytest.raises(ConfigError):
        WorkerBridge(home=home).cluster_status()
    assert not home.exists()  # said before the state root is made


def test_the_slots_status_counts_are_the_scope_the_pipeline_takes():
    from bridge.pipeline.node_turn import slot_scope as taken

    assert slot_scope("n1") == taken("n1")
