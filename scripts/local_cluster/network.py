"""The cluster's network: a hub namespace holding a bridge, and a veth from the bridge into the
control namespace and into each node's. Both ends of a veth are made directly inside their
namespaces, so no interface of ours ever appears in the host's namespace, and deleting the
namespaces deletes every link."""

from __future__ import annotations

import subprocess

from local_cluster.layout import CONTROL_IP, HUB_IP, PREFIX, ClusterLayout, netns_path


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def add_namespace(name: str) -> None:
    if netns_path(name).exists():
        raise RuntimeError(
            f"network namespace {name} exists already: another cluster of this name is up"
            " (`scripts/local-cluster down` removes it)"
        )
    _ip("netns", "add", name)
    _ip("-n", name, "link", "set", "lo", "up")


def make_hub(layout: ClusterLayout) -> None:
    hub = layout.hub_netns
    add_namespace(hub)
    _ip("-n", hub, "link", "add", "br0", "type", "bridge")
    _ip("-n", hub, "addr", "add", f"{HUB_IP}/{PREFIX}", "dev", "br0")
    _ip("-n", hub, "link", "set", "br0", "up")


def attach(layout: ClusterLayout, netns: str, ip: str, port_name: str) -> None:
    """A namespace of ours on the bridge: its `eth0` at ``ip``, the hub's end ``port_name``."""
    hub = layout.hub_netns
    add_namespace(netns)
    _ip("-n", hub, "link", "add", port_name, "type", "veth", "peer", "name", "eth0", "netns", netns)
    _ip("-n", hub, "link", "set", port_name, "master", "br0", "up")
    _ip("-n", netns, "addr", "add", f"{ip}/{PREFIX}", "dev", "eth0")
    _ip("-n", netns, "link", "set", "eth0", "up")


def attach_control(layout: ClusterLayout) -> None:
    attach(layout, layout.control_netns, CONTROL_IP, "vctl")


def set_link(layout: ClusterLayout, port_name: str, up: bool) -> None:
    """Cut a namespace off the bridge (its hub-side link down), or join it again."""
    _ip("-n", layout.hub_netns, "link", "set", port_name, "up" if up else "down")


def delete_namespace(name: str) -> bool:
    """Delete one namespace if it exists (its links go with it); whether it existed."""
    if not netns_path(name).exists():
        return False
    _ip("netns", "delete", name)
    return True
