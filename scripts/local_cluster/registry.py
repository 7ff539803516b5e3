"""Debian's `docker-registry` (CNCF distribution), started by pid, never as a service: it
serves on a Unix socket in the cluster's scratch folder, and two forwarders (socat) give it
its two addresses. The nodes reach it at the hub's address (their engines list it as an
insecure registry); the control host's engine, in the host's namespace, reaches it on
loopback, which every engine trusts over plain HTTP without any setting: the main engine's
configuration stays as it is."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

from local_cluster import procs
from local_cluster.layout import HUB_IP, REGISTRY_PORT, ClusterLayout
from local_cluster.state import Proc

BINARY = "/usr/bin/docker-registry"
START_TIMEOUT_S = 30


def config(layout: ClusterLayout) -> str:
    return "\n".join(
        [
            "version: 0.1",
            "log:",
            "  level: warn",
            "  accesslog:",
            "    disabled: true",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {layout.registry_home / 'data'}",
            "  delete:",
            "    enabled: true",
            "http:",
            f"  addr: {layout.registry_socket}",
            "  net: unix",
            "",
        ]
    )


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _forward(layout: ClusterLayout, role: str, listen: str, netns: str | None) -> Proc:
    return procs.spawn(
        role,
        ["socat", listen, f"UNIX-CONNECT:{layout.registry_socket}"],
        layout.logs / f"{role}.log",
        netns=netns,
    )


def _tcp_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2) as s:
            s.sendall(b"GET /v2/ HTTP/1.0\r\n\r\n")
            return s.recv(64).split(b" ")[1:2] == [b"200"]
    except OSError:
        return False


def start(layout: ClusterLayout, record: Callable[[Proc], Proc]) -> tuple[str, str]:
    """The registry and its forwarders (each recorded through ``record`` as it starts); the
    registry's address for the control host and for the nodes."""
    if not Path(BINARY).exists():
        raise RuntimeError(f"{BINARY} is missing: apt-get install docker-registry")
    layout.registry_home.mkdir(parents=True, exist_ok=True)
    (layout.registry_home / "config.yml").write_text(config(layout))
    server = record(
        procs.spawn(
            "registry",
            [BINARY, "serve", str(layout.registry_home / "config.yml")],
            layout.logs / "registry.log",
            netns=layout.hub_netns,
        )
    )
    record(
        _forward(
            layout,
            "forward-hub",
            f"TCP-LISTEN:{REGISTRY_PORT},bind={HUB_IP},reuseaddr,fork",
            layout.hub_netns,
        )
    )
    port = _free_loopback_port()
    host_side = record(
        _forward(layout, "forward-host", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork", None)
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _tcp_answers("127.0.0.1", port):
        for proc in (server, host_side):
            if not procs.is_running(proc):
                raise RuntimeError(f"the registry's {proc.role} exited:\n{procs.log_tail(proc)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the registry did not answer within {START_TIMEOUT_S} s")
        time.sleep(0.05)
    return f"127.0.0.1:{port}", layout.registry_for_nodes
