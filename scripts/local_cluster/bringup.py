"""Bringing a cluster up, and one node back after it was killed. Everything is written to the
state file before it is made (the nodes, the namespaces) or right after it starts (each
process, by pid and start time), so a failure or a kill half way leaves a state that `down`
reads. The slow parts start together: every node's engine, the registry and the Ray head; the
Ray nodes once the head answers."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from local_cluster import engines, network, procs, ray_nodes, registry, teardown
from local_cluster.layout import ClusterLayout, NodeLayout
from local_cluster.state import NodeRecord, Proc, State

HEAD_TIMEOUT_S = 90
NODES_TIMEOUT_S = 120


@dataclass(frozen=True)
class Options:
    count: int
    slots: int | None  # None: from each node's cores and memory
    ray: bool
    registry: bool
    venv: Path
    owner_pid: int | None = None


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def check_prerequisites(options: Options) -> None:
    if os.geteuid() != 0:
        raise RuntimeError("the local cluster needs root (namespaces, daemons, cgroups)")
    needed = ["ip", "nsenter", "containerd", "dockerd", "umount"]
    needed += ["socat"] if options.registry else []
    missing = [name for name in needed if shutil.which(name) is None]
    if options.registry and not Path(registry.BINARY).exists():
        missing.append("docker-registry")
    if missing:
        raise RuntimeError(f"missing: {', '.join(missing)} (apt-get install them; .ci/run does)")
    if options.ray and not (options.venv / "bin" / "ray").exists():
        raise RuntimeError(
            f"no Ray in {options.venv}: `make install` installs the `cluster` extra"
            " (or pass --venv)"
        )


def _recorder(layout: ClusterLayout, state: State) -> Callable[[Proc], Proc]:
    def record(proc: Proc) -> Proc:
        state.processes.append(proc)
        state.save(layout.state_file)
        return proc

    return record


def _node_record(node: NodeLayout, slots: int, cpus: int) -> NodeRecord:
    return NodeRecord(
        name=node.name,
        netns=node.netns,
        ip=node.ip,
        docker_host=node.docker_host,
        containerd_socket=str(node.containerd_socket),
        cgroup_parent=node.cgroup_parent,
        resource=node.resource,
        slots=slots,
        cpus=cpus,
    )


def _start_engine(layout: ClusterLayout, node: NodeLayout, record) -> list[Proc]:
    engines.write_configs(layout, node)
    return [
        record(engines.start_containerd(layout, node)),
        record(engines.start_dockerd(layout, node)),
    ]


def _wait_nodes(layout: ClusterLayout, venv: Path, names: list[str], timeout_s: float) -> None:
    seen = ray_nodes.probe(layout, venv, names, timeout_s)
    if seen["missing"] or seen["error"]:
        raise RuntimeError(
            f"Ray nodes not alive within {timeout_s:.0f} s: {seen['missing']} {seen['error']}"
        )


def up(layout: ClusterLayout, options: Options) -> State:
    """Make the cluster; on any failure take down what was made, then raise."""
    check_prerequisites(options)
    if layout.state_file.exists() or teardown.namespaces(layout):
        raise RuntimeError(
            f"cluster {layout.name!r} exists already (or was left half made):"
            f" `scripts/local-cluster down --name {layout.name}` first"
        )
    state = State.new(layout)
    state.ray = options.ray
    if options.owner_pid:
        state.owner_pid = options.owner_pid
        state.owner_start = procs.start_time(options.owner_pid)
    cpus = os.cpu_count() or 1
    slots = options.slots or ray_nodes.default_slots()
    nodes = [layout.node(i) for i in range(1, options.count + 1)]
    state.nodes = [_node_record(node, slots, cpus) for node in nodes]
    layout.logs.mkdir(parents=True, exist_ok=True)
    state.save(layout.state_file)
    try:
        _make(layout, state, nodes, options)
    except BaseException:
        say("up failed: taking down what was made")
        teardown.down(layout, State.load(layout.state_file))
        raise
    return state


def _make(layout: ClusterLayout, state: State, nodes: list[NodeLayout], options: Options) -> None:
    began = time.monotonic()
    record = _recorder(layout, state)
    network.make_hub(layout)
    network.attach_control(layout)
    for node in nodes:
        network.attach(layout, node.netns, node.ip, f"v{node.name}")
    daemons = {node.name: _start_engine(layout, node, record) for node in nodes}
    if options.ray:
        ray_nodes.write_token(layout)
        record(ray_nodes.start_head(layout, options.venv))
    if options.registry:
        state.registry_push, state.registry_pull = registry.start(layout, record)
        state.save(layout.state_file)
        say(f"registry: {state.registry_push} (nodes: {state.registry_pull})")
    for node in nodes:
        engines.wait_for_engine(node, daemons[node.name])
    say(f"{len(nodes)} engines answer ({time.monotonic() - began:.1f} s)")
    if options.ray:
        _wait_nodes(layout, options.venv, ["control"], HEAD_TIMEOUT_S)
        state.address = layout.address
        state.save(layout.state_file)
        for node, spec in zip(nodes, state.nodes, strict=True):
            record(ray_nodes.start_node(layout, node, options.venv, spec.slots, spec.cpus))
        _wait_nodes(layout, options.venv, [n.name for n in nodes], NODES_TIMEOUT_S)
        say(f"Ray: head and {len(nodes)} nodes alive ({time.monotonic() - began:.1f} s)")
    state.ready = True
    state.save(layout.state_file)


def start_node(layout: ClusterLayout, state: State, name: str, venv: Path) -> None:
    """Start a node again after it was killed: its mounts and cgroups cleaned, its engine (with
    the data root it had, images and all) and its Ray node process."""
    if teardown.processes(layout, state, name):
        raise RuntimeError(f"{name} still runs: `scripts/local-cluster kill {name}` first")
    record = _recorder(layout, state)
    state.forget(state.of_node(name))
    state.save(layout.state_file)
    teardown.clean_node(layout, state, name)
    node = layout.node(int(name[1:]))
    engines.wait_for_engine(node, _start_engine(layout, node, record))
    if state.ray:
        spec = state.node(name)
        record(ray_nodes.start_node(layout, node, venv, spec.slots, spec.cpus))
        _wait_nodes(layout, venv, [name], NODES_TIMEOUT_S)
