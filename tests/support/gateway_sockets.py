"""Clients of a gateway on its Unix sockets, playing the sandbox (no engine): a gateway started
on a folder with one `test` route to the test upstream (or every built-in route pointed there),
raw HTTP/1.1 requests and CONNECT tunnels on its sockets, and the events it records."""

from __future__ import annotations

import socket
from pathlib import Path

from support.upstream import Upstream

from bridge.config.settings import GatewayConfig
from bridge.gateway.policy import Route
from bridge.gateway.server import Gateway

KEY = "sk-" + "real-upstream-key-" + "9f8e7d6c5b4a"  # the host's key for the test route


class Events:
    """The events a gateway records, kept in order: (kind, data)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, dict]] = []

    def __call__(self, kind: str, data: dict) -> None:
        self.items.append((kind, data))

    def of(self, kind: str) -> list[dict]:
        return [d for k, d in self.items if k == kind]


def gateway(folder: Path, upstream: Upstream, events: Events, allowlist=None, **cfg) -> Gateway:
    """A started gateway on FOLDER whose one route, `test`, leads to UPSTREAM with KEY; `ports`
    and `trusted` stand for its CONNECT/HTTP ports and trusted ranges, the rest is config."""
    config = GatewayConfig(
        trusted_ranges=cfg.pop("trusted", []),
        connect_ports=cfg.get("ports", [443]),
        http_ports=cfg.pop("ports", [80]),
        **cfg,
    )
    routes = {"test": Route("test", upstream.url, "x-api-key", "TEST_KEY", KEY)}
    return Gateway(folder, routes, allowlist, config, events).start()


def localhost_gateway(
    folder: Path, upstream: Upstream, events: Events, *, trusted=("127.0.0.0/8",), **cfg
) -> Gateway:
    """A started gateway whose proxy's allowlist names `localhost`, on the upstream's port, with
    TRUSTED ranges (loopback by default, so that the name may be reached)."""
    ports = [upstream.port]
    return gateway(
        folder, upstream, events, ["localhost"], trusted=list(trusted), ports=ports, **cfg
    )


def request(sock_path: Path, raw: bytes, timeout: float = 10) -> bytes:
    """Send ``raw`` on the socket and read until the server closes (Connection: close)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(sock_path))
        try:
            s.sendall(raw)
        except BrokenPipeError:
            pass  # answered (and closed) before the body was all sent: a 413 does that
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def http(method: str, target: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    """One HTTP/1.1 request asking the server to close after answering."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> bytes:
    return response.split(b"\r\n\r\n", 1)[1]


def connect(sock_path: Path, host: str, port: int, then: bytes) -> bytes:
    """CONNECT HOST:PORT on the proxy socket; once tunnelled, send THEN; everything answered."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock_path))
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(65536)
            if not chunk:
                return head
            head += chunk
        if status_of(head) != 200:
            while chunk := s.recv(65536):
                head += chunk
            return head
        s.sendall(then)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return head + out


def built_in_routes(upstream: Upstream) -> dict[str, Route]:
    """Every built-in route with its own list of paths, pointed at the test upstream."""
    from bridge.gateway.policy import BUILTIN_ROUTES

    return {
        name: Route(name, upstream.url, "bearer", None, KEY, tuple(route.paths or ()))
        for name, route in BUILTIN_ROUTES.items()
    }
