"""The cluster's commands without an engine or Ray: `cluster status` over node agents in this
process (each a fake sandbox of its own), the one-sentence refusals of `node start` and
`cluster status`, the `ray start` that `node start` builds, and starting and stopping a node
by its recorded pid (a stand-in for `ray` that only sleeps)."""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bridge import WorkerBridge
from bridge.cli.cluster import cmd_cluster_status
from bridge.cluster import node_process
from bridge.cluster.link import NodeInfo, node_root, slot_scope
from bridge.cluster.node_process import (
    NAME,
    Machine,
    NodeRequest,
    Recorded,
    default_node_name,
    node_processes,
    plan_node,
    start_node,
    stop_node,
)
from bridge.cluster.status import NOT_CONFIGURED, cluster_status
from bridge.errors import BridgeError, ConfigError, InvalidSpec
from bridge.pipeline.node_agent import NodeAgent
from bridge.pipeline.nodes import LocalNodes
from bridge.sandbox.fake import FakeSandbox
from bridge.sandbox.spec import ImageInfo
from bridge.store.owners import Owner

ADDRESS = "10.0.0.2:6379"
GIB = 2**30


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
        n1, n2 = cluster_status(nodes, bridge.store)
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


# -- node start: the command -------------------------------------------------------------------


@pytest.fixture
def token(workdir: Path) -> Path:
    path = workdir / "ray-token"
    path.write_text("secret")
    path.chmod(0o600)
    return path


def token_env(token: Path, **more: str) -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "PATH": "/bin", **more}


def test_node_start_builds_ray_start_with_the_nodes_resources_and_environment(token, workdir):
    request = NodeRequest(
        ADDRESS, name="gpu-1", slots=3, docker_host="unix:///run/n1.sock", root=workdir / "n"
    )
    launch = plan_node(
        request, environ=token_env(token), machine=Machine(8, 64 * GIB), ray="/venv/bin/ray"
    )
    assert launch.argv == (
        "/venv/bin/ray",
        "start",
        "--block",
        "--address",
        ADDRESS,
        "--node-name",
        "gpu-1",
        "--resources",
        '{"wb_node:gpu-1": 1, "wb_slot": 3}',
        "--num-cpus",
        "8",
        "--disable-usage-stats",
    )
    assert launch.env == {
        **token_env(token),  # passed through: Ray reads its token from there
        "WORKER_BRIDGE_NODE_HOME": str(workdir / "n"),
        "DOCKER_HOST": "unix:///run/n1.sock",
    }
    assert launch.state_file == workdir / "n" / "ray-node.json"


def test_node_start_defaults_to_the_hosts_name_its_slots_and_the_agents_own_root(
    token, monkeypatch
):
    monkeypatch.delenv("WORKER_BRIDGE_NODE_HOME", raising=False)
    monkeypatch.setattr(node_process.socket, "gethostname", lambda: "Build_Box.example.com")
    launch = plan_node(
        NodeRequest(ADDRESS), environ=token_env(token), machine=Machine(16, 24 * GIB), ray="ray"
    )
    assert launch.name == "build-box" and launch.slots == 6  # 24 GiB / 4
    assert json.loads(launch.argv[launch.argv.index("--resources") + 1]) == {
        "wb_node:build-box": 1,
        "wb_slot": 6,
    }
    assert launch.root == node_root("build-box")
    assert launch.env["WORKER_BRIDGE_NODE_HOME"] == str(node_root("build-box"))
    assert "DOCKER_HOST" not in launch.env


@pytest.mark.parametrize(
    "hostname, name",
    [
        ("vm", "vm"),
        ("Build-Box.example.com", "build-box"),
        ("my_host", "my-host"),
        ("42web", "web"),
        ("a" * 30, "a" * 15),
        ("abcdefghijklmn-x", "abcdefghijklmn"),  # cut at 15, no dash left at the end
        ("___", "node"),
    ],
)
def test_the_hostname_is_made_a_node_name(hostname, name):
    assert default_node_name(hostname) == name
    assert NAME.fullmatch(name)


def test_the_default_slots_are_the_fewer_of_cores_and_4_gib_each_and_at_least_one():
    assert Machine(2, 24 * GIB).default_slots() == 2
    assert Machine(16, 8 * GIB).default_slots() == 2
    assert Machine(4, GIB).default_slots() == 1


@pytest.mark.parametrize(
    "given, names",
    [
        ({"name": "Upper"}, "--name"),
        ({"name": "1abc"}, "--name"),
        ({"name": "a" * 16}, "--name"),
        ({"name": "a/b"}, "--name"),
        ({"slots": 0}, "--slots"),
        ({"slots": 5000}, "--slots"),
        ({"address": "10.0.0.2"}, "--address"),
        ({"address": "10.0.0.2:0"}, "--address"),
        ({"address": "10.0.0.2:65536"}, "--address"),
        ({"address": ":6379"}, "--address"),
        ({"address": "a b:6379"}, "--address"),
        ({"docker_host": "/run/docker.sock"}, "--docker-host"),
    ],
)
def test_a_bad_argument_is_refused_naming_it(token, given, names):
    request = NodeRequest(**{"address": ADDRESS, "name": "n1", **given})
    with pytest.raises(InvalidSpec, match=names):
        plan_node(request, environ=token_env(token), ray="ray")


def test_node_start_refuses_a_bad_name_in_one_line_and_starts_nothing(cli, workdir, token):
    root = workdir / "node-root"
    result = cli(
        "node", "start", "--address", ADDRESS, "--name", "Bad_Name", "--root", str(root),
        env=token_env(token, PATH=os.environ["PATH"]),
    )  # fmt: skip
    the_error_line(result, 2, "--name 'Bad_Name'")
    the_error_line(
        cli("node", "start", "--address", ADDRESS, "--slots", "0", "--root", str(root)),
        2,
        "--slots 0",
    )
    assert not root.exists()


def test_node_start_without_token_auth_is_refused_unless_told_it_is_insecure(token):
    request = NodeRequest(ADDRESS, name="n1")
    for env in ({}, {"RAY_AUTH_MODE": "disabled"}):
        with pytest.raises(ConfigError, match="RAY_AUTH_MODE"):
            plan_node(request, environ=env, ray="ray")
    with pytest.raises(ConfigError, match="cannot be read"):
        plan_node(request, environ=token_env(token.with_name("absent")), ray="ray")
    insecure = replace(request, insecure_no_token=True)
    assert plan_node(insecure, environ={}, ray="ray", machine=Machine(1, GIB)).slots == 1


def test_without_ray_installed_node_start_names_the_cluster_extra(token, workdir, monkeypatch):
    monkeypatch.setattr(node_process.sys, "executable", str(workdir / "python"))
    monkeypatch.setenv("PATH", str(workdir))
    with pytest.raises(BridgeError, match=r"`cluster` extra"):
        plan_node(NodeRequest(ADDRESS, name="n1"), environ=token_env(token))


# -- node start and stop: the process ----------------------------------------------------------


def stand_in(workdir: Path, script: str) -> str:
    """An executable in place of `ray`, running ``script`` with sh."""
    path = workdir / "ray"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return str(path)


def launch_with(workdir: Path, token: Path, script: str) -> node_process.NodeLaunch:
    request = NodeRequest(ADDRESS, name="n1", slots=1, root=workdir / "node")
    env = token_env(token, PATH=os.environ["PATH"])
    return plan_node(request, environ=env, ray=stand_in(workdir, script))


def test_a_started_node_is_recorded_privately_and_stopped_by_its_session_alone(workdir, token):
    # Like Ray's: services in the leader's group, a worker in a group of its own.
    worker = f"{sys.executable} -c 'import os, time; os.setpgid(0, 0); time.sleep(600)'"
    launch = launch_with(workdir, token, f"{worker} & sleep 600")
    bystander = subprocess.Popen(["sleep", "600"])  # this user's too, not of the node
    try:
        started = start_node(launch, settle_s=0.5)
        record = Recorded.read(launch.state_file)
        assert record is not None and record.pid == started.pid and record.name == "n1"
        assert stat.S_IMODE(launch.state_file.stat().st_mode) == 0o600
        found = node_processes(record)
        assert len(found) == 3  # sh, its sleep and the worker
        assert {os.getpgid(pid) for pid in found} - {record.pid}  # the worker's own group
        with pytest.raises(BridgeError, match="already runs"):
            start_node(launch, settle_s=0.3)

        stopped = stop_node(launch.root)
        assert stopped.was_running and not stopped.killed
        assert node_processes(record) == []
        assert not launch.state_file.exists()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_node_that_ignores_term_is_killed_after_the_grace_period(workdir, token):
    launch = launch_with(workdir, token, "trap '' TERM; sleep 600 & sleep 600")
    start_node(launch, settle_s=0.3)
    stopped = stop_node(launch.root, grace_s=0.3)
    assert stopped.was_running and stopped.killed
    assert not launch.state_file.exists()


def test_a_ray_start_that_exits_at_once_is_an_error_with_its_logs_tail(workdir, token):
    launch = launch_with(workdir, token, "echo 'ConnectionError: the head does not answer'; exit 3")
    with pytest.raises(BridgeError) as caught:
        start_node(launch, settle_s=5)
    assert "status 3" in caught.value.message
    assert "the head does not answer" in caught.value.message
    assert not launch.state_file.exists()


def test_a_recorded_pid_that_is_now_another_process_is_never_signalled(workdir):
    root = workdir / "node"
    root.mkdir()
    mine = Recorded("n1", ADDRESS, os.getpid(), start=1)  # this test's pid, another start time
    mine.write(root / "ray-node.json")
    stopped = stop_node(root)
    assert not stopped.was_running
    assert not (root / "ray-node.json").exists()


def test_node_stop_without_a_recorded_node_says_where_it_looked(workdir):
    with pytest.raises(BridgeError, match="is recorded in"):
        stop_node(workdir / "nowhere")


@pytest.mark.parametrize("pid", [0, -1, 1])
def test_a_record_naming_no_process_of_its_own_is_refused_not_signalled(workdir, pid):
    root = workdir / "node"
    root.mkdir()
    (root / "ray-node.json").write_text(
        json.dumps({"name": "n1", "address": ADDRESS, "pid": pid, "start": 1})
    )
    with pytest.raises(BridgeError, match="is not a node's record"):
        stop_node(root)
