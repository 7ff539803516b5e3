"""The state file: what `up` made, written before each thing is made and after each process
starts, so that `down` (and `status`) can read it after a finished `up`, a half-made one or a
killed one. It names processes by pid *and* start time: a pid the kernel gave to another
process since is not ours, and is never signalled."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from local_cluster.layout import ClusterLayout

VERSION = 1


@dataclass
class Proc:
    """A process the cluster started: a daemon, a Ray node process (the leader of its process
    group: `setsid`), the registry or one of its forwarders."""

    role: str  # containerd, dockerd, ray, ray-head, registry, forward-hub, forward-host
    pid: int
    start: int  # /proc/<pid>/stat field 22, clock ticks after boot
    log: str
    node: str | None = None  # n1, n2...: None for the cluster's own processes
    netns: str | None = None  # None: the host's network namespace


@dataclass
class NodeRecord:
    name: str
    netns: str
    ip: str
    docker_host: str
    containerd_socket: str
    cgroup_parent: str
    resource: str  # the Ray resource naming it
    slots: int  # its `wb_slot` resource
    cpus: int


@dataclass
class State:
    name: str
    scratch: str
    hub_netns: str
    control_netns: str
    token_file: str
    nodes: list[NodeRecord] = field(default_factory=list)
    processes: list[Proc] = field(default_factory=list)
    address: str | None = None  # HOST:PORT of the Ray head, once it answers
    registry_push: str | None = None  # the registry as the control host's engine reaches it
    registry_pull: str | None = None  # ... and as the nodes' engines do
    ray: bool = True
    owner_pid: int | None = None  # a process whose end means the cluster may be reaped
    owner_start: int | None = None
    ready: bool = False  # `up` finished
    version: int = VERSION

    @classmethod
    def new(cls, layout: ClusterLayout) -> State:
        return cls(
            name=layout.name,
            scratch=str(layout.scratch),
            hub_netns=layout.hub_netns,
            control_netns=layout.control_netns,
            token_file=str(layout.token_file),
        )

    def node(self, name: str) -> NodeRecord:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r} in cluster {self.name!r}")

    def of_node(self, name: str | None) -> list[Proc]:
        return [p for p in self.processes if p.node == name]

    def forget(self, procs: list[Proc]) -> None:
        gone = {(p.pid, p.start) for p in procs}
        self.processes = [p for p in self.processes if (p.pid, p.start) not in gone]

    def save(self, path: Path) -> None:
        """Atomically, readable by root only (it names the token's file and every socket)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(self), out, indent=2)
            out.write("\n")
        os.replace(temp, path)

    @classmethod
    def load(cls, path: Path) -> State | None:
        """The state written by `up` (None: there is none)."""
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        if raw.get("version") != VERSION:
            raise ValueError(
                f"{path}: state version {raw.get('version')}, this script reads {VERSION}"
            )
        nodes = [NodeRecord(**n) for n in raw.pop("nodes")]
        procs = [Proc(**p) for p in raw.pop("processes")]
        return cls(**raw, nodes=nodes, processes=procs)
