"""A node's engine: its own containerd and dockerd, each with its own root, state, sockets,
pidfile and configuration file (the machine's engine and its /etc/docker/daemon.json are
never read or touched), in the node's network namespace. The engine registers runsc as
`.ci/run` registers it on the main engine, trusts the hub's registry over plain HTTP, makes no
bridge and no iptables rules (worker-bridge's containers have no network), and puts its
containers' cgroups under the node's own parent."""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

from local_cluster import procs
from local_cluster.layout import ClusterLayout, NodeLayout
from local_cluster.state import Proc

RUNSC = {"path": "/usr/bin/runsc", "runtimeArgs": ["--host-uds=open", "--network=none"]}
START_TIMEOUT_S = 60


def containerd_config(node: NodeLayout) -> str:
    home = node.home / "containerd"
    return "\n".join(
        [
            "version = 2",
            f'root = "{home / "root"}"',
            f'state = "{home / "state"}"',
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
            "[grpc]",
            f'  address = "{node.containerd_socket}"',
            "[ttrpc]",
            f'  address = "{node.containerd_socket}.ttrpc"',
            "[debug]",
            '  address = ""',
            '[plugins."io.containerd.internal.v1.opt"]',
            f'  path = "{home / "opt"}"',
            "",
        ]
    )


def docker_config(layout: ClusterLayout, node: NodeLayout) -> dict:
    home = node.home / "docker"
    return {
        "data-root": str(home / "data"),
        "exec-root": str(home / "exec"),
        "pidfile": str(home / "dockerd.pid"),
        "hosts": [node.docker_host],
        "containerd": str(node.containerd_socket),
        "cgroup-parent": f"/{node.cgroup_parent}",
        # The engine's identity key: its own, not /etc/docker/key.json (the main engine's).
        "deprecated-key-path": str(home / "key.json"),
        "storage-driver": "overlay2",
        "bridge": "none",
        "iptables": False,
        "ip-forward": False,
        "ip-masq": False,
        "userland-proxy": False,
        "insecure-registries": [layout.registry_for_nodes],
        "runtimes": {"runsc": RUNSC},
        "log-driver": "json-file",
        "shutdown-timeout": 5,
    }


def write_configs(layout: ClusterLayout, node: NodeLayout) -> None:
    node.containerd_socket.parent.mkdir(parents=True, exist_ok=True)
    (node.home / "docker").mkdir(parents=True, exist_ok=True)
    node.containerd_config.write_text(containerd_config(node))
    node.docker_config.write_text(json.dumps(docker_config(layout, node), indent=2) + "\n")


def start_containerd(layout: ClusterLayout, node: NodeLayout) -> Proc:
    return procs.spawn(
        "containerd",
        ["containerd", "--config", str(node.containerd_config)],
        layout.logs / f"{node.name}-containerd.log",
        netns=node.netns,
        node=node.name,
    )


def start_dockerd(layout: ClusterLayout, node: NodeLayout) -> Proc:
    return procs.spawn(
        "dockerd",
        ["dockerd", "--config-file", str(node.docker_config)],
        layout.logs / f"{node.name}-dockerd.log",
        netns=node.netns,
        node=node.name,
    )


# -- asking an engine over its socket (the standard library only) -------------------------------


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def engine_get(docker_socket: Path, path: str, timeout: float = 5) -> object | None:
    """GET ``path`` of an engine's API as JSON; None when it does not answer."""
    connection = _UnixConnection(docker_socket, timeout)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        body = answer.read()
        return json.loads(body) if answer.status == 200 and body.strip() else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        connection.close()


def engine_answers(docker_socket: Path) -> bool:
    return engine_get(docker_socket, "/version", timeout=2) is not None


def wait_for_engine(node: NodeLayout, watched: list[Proc]) -> None:
    """Until the node's dockerd answers; a daemon of ``watched`` that ends first fails it."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not engine_answers(node.docker_socket):
        for proc in watched:
            if not procs.is_running(proc):
                raise RuntimeError(
                    f"{node.name}'s {proc.role} exited while starting:\n{procs.log_tail(proc)}"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"{node.name}'s dockerd did not answer within {START_TIMEOUT_S} s")
        time.sleep(0.05)


def describe(docker_socket: Path) -> dict | None:
    """The engine's version and its images (reference and id); None when it does not answer."""
    version = engine_get(docker_socket, "/version")
    if not isinstance(version, dict):
        return None
    images = engine_get(docker_socket, "/images/json") or []
    listed = []
    for image in images if isinstance(images, list) else []:
        names = [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]
        names = names or [d.split("@")[0] + "@…" for d in image.get("RepoDigests") or []]
        listed.append({"id": image.get("Id", ""), "references": names})
    return {"version": version.get("Version", "?"), "images": listed}
