"""Every name and path of a local cluster, derived from its name alone (nothing here touches
the machine): `down` and `status` can therefore find what a half-made `up` left even when
the state file lists less than was made.

The subnet lives only inside the cluster's namespaces: the hub holds a bridge, the control
namespace (the Ray head, the drivers) and each node have a veth into it. Two clusters of
different names use the same addresses in different namespaces and never meet."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.250.77"
PREFIX = 24
HUB_IP = f"{SUBNET}.1"  # the bridge; the registry's address for the nodes
CONTROL_IP = f"{SUBNET}.2"  # the Ray head: the cluster's address
RAY_PORT = 6379
REGISTRY_PORT = 5000
MAX_NODES = 200
NAME = re.compile(r"^[a-z][a-z0-9-]{0,14}$")
SCRATCH_ROOT = Path("/var/tmp/wbc")  # short: Ray's and containerd's socket paths grow from it
NETNS_DIR = Path("/run/netns")


@dataclass(frozen=True)
class NodeLayout:
    """One simulated node: its namespace, address, folders, sockets and cgroup parent."""

    cluster: str
    index: int
    scratch: Path  # the cluster's

    @property
    def name(self) -> str:
        return f"n{self.index}"

    @property
    def netns(self) -> str:
        return f"{self.cluster}-{self.name}"

    @property
    def ip(self) -> str:
        return f"{SUBNET}.{10 + self.index}"

    @property
    def home(self) -> Path:
        return self.scratch / self.name

    @property
    def containerd_config(self) -> Path:
        return self.home / "containerd.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.home / "containerd" / "containerd.sock"

    @property
    def docker_config(self) -> Path:
        return self.home / "daemon.json"

    @property
    def docker_socket(self) -> Path:
        return self.home / "docker.sock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.docker_socket}"

    @property
    def cgroup_parent(self) -> str:
        """Where the node's engine puts its containers' cgroups, in every hierarchy."""
        return f"wbc-{self.cluster}-{self.name}"

    @property
    def ray_temp(self) -> Path:
        return self.home / "ray"

    @property
    def resource(self) -> str:
        """The Ray resource only this node has: a task pinned to the node asks for it."""
        return f"wb_node:{self.name}"


@dataclass(frozen=True)
class ClusterLayout:
    name: str
    scratch_root: Path = SCRATCH_ROOT

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ValueError(
                f"cluster name {self.name!r}: a lower-case letter, then up to 14 of a-z, 0-9, -"
            )

    @property
    def scratch(self) -> Path:
        return self.scratch_root / self.name

    @property
    def state_file(self) -> Path:
        return self.scratch / "state.json"

    @property
    def logs(self) -> Path:
        return self.scratch / "logs"

    @property
    def hub_netns(self) -> str:
        return f"{self.name}-hub"

    @property
    def control_netns(self) -> str:
        return f"{self.name}-ctl"

    @property
    def address(self) -> str:
        return f"{CONTROL_IP}:{RAY_PORT}"

    @property
    def token_file(self) -> Path:
        return self.scratch / "ray-token"

    @property
    def control_ray_temp(self) -> Path:
        return self.scratch / "ctl" / "ray"

    @property
    def registry_home(self) -> Path:
        return self.scratch / "registry"

    @property
    def registry_socket(self) -> Path:
        return self.registry_home / "registry.sock"

    @property
    def registry_for_nodes(self) -> str:
        return f"{HUB_IP}:{REGISTRY_PORT}"

    def node(self, index: int) -> NodeLayout:
        if not 1 <= index <= MAX_NODES:
            raise ValueError(f"node index {index}: 1 to {MAX_NODES}")
        return NodeLayout(self.name, index, self.scratch)

    def netns_names(self, node_count: int) -> list[str]:
        """Every namespace of the cluster, the hub last (the others' veths end in it)."""
        nodes = [self.node(i).netns for i in range(1, node_count + 1)]
        return [*nodes, self.control_netns, self.hub_netns]


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def node_index(name: str) -> int:
    """`n3` -> 3."""
    if not re.fullmatch(r"n[1-9][0-9]*", name):
        raise ValueError(f"no node {name!r}: nodes are named n1, n2, ...")
    return int(name[1:])
