"""`worker-bridge-mcp --http` for the tests: started on a free loopback port with its own state
root until /healthz answers, always stopped by its pid (SIGTERM, then SIGKILL), its log read
back; and an SDK client session over streamable HTTP sending a bearer token."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.cli import MCP_SERVER
from support.mcp_session import REQUEST_TIMEOUT_S, server_env

START_DEADLINE_S = 30
POLL_S = 0.1
PORT_ATTEMPTS = 4


def free_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class HttpServer:
    proc: subprocess.Popen
    url: str  # http://127.0.0.1:PORT, without the /mcp path
    home: Path
    stderr_path: Path

    def log_text(self) -> str:
        """Everything the server logged: its stderr and the log file under the state root."""
        log_file = self.home / "logs" / "mcp-server.log"
        text = self.stderr_path.read_text(errors="replace")
        return text + (log_file.read_text(errors="replace") if log_file.exists() else "")


@contextmanager
def http_server(home: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[HttpServer]:
    """`worker-bridge-mcp --http 127.0.0.1:PORT ARGS...` until /healthz answers; always stopped
    by its pid on the way out."""

    def start(port: int) -> HttpServer:
        stderr_path = home.parent / f"mcp-http-{port}.log"
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(
                [*MCP_SERVER, "--http", f"127.0.0.1:{port}", *args],
                env=server_env(home, env),
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
            )
        return HttpServer(proc, f"http://127.0.0.1:{port}", home, stderr_path)

    with serving(on_free_port(start, _healthy), _healthy, "the server") as running:
        yield running


def on_free_port(start: Callable[[int], Any], ready: Callable[[str], bool]) -> Any:
    """``start(port)`` on a port free a moment ago, started again on another one when it could
    not listen because another process (a test running alongside) took that port meanwhile.
    Returns the server unchecked otherwise: `serving` says what went wrong."""
    for _ in range(PORT_ATTEMPTS - 1):
        server = start(free_port())
        deadline = time.monotonic() + START_DEADLINE_S
        while server.proc.poll() is None and not ready(server.url):
            if time.monotonic() > deadline:
                return server
            time.sleep(POLL_S)
        if server.proc.poll() is None or "address already in use" not in server.log_text():
            return server
    return start(free_port())


@contextmanager
def serving(server: Any, ready: Callable[[str], bool], what: str) -> Iterator[Any]:
    """SERVER (its `proc`, `url` and `log_text()`) until ``ready(url)``; on the way out stopped
    by its pid (SIGTERM, then SIGKILL), and its log must hold no traceback."""
    proc = server.proc
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not ready(server.url):
            assert proc.poll() is None, f"{what} exited {proc.returncode}: {server.log_text()}"
            assert time.monotonic() < deadline, f"no answer from {what}: {server.log_text()}"
            time.sleep(POLL_S)
        yield server
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, 15)  # SIGTERM: uvicorn shuts down gracefully
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, 9)
                proc.wait(timeout=10)
    assert "Traceback" not in server.log_text(), server.log_text()


def _healthy(url: str) -> bool:
    try:
        return httpx2.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx2.HTTPError:
        return False


@asynccontextmanager
async def http_client(url: str, token: str | None) -> AsyncIterator[Client]:
    """An initialised SDK client session on URL/mcp over streamable HTTP, sending the bearer
    token (none when TOKEN is None)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx2.Timeout(30, read=300)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        transport = streamable_http_client(f"{url}/mcp", http_client=http)
        async with Client(transport, read_timeout_seconds=REQUEST_TIMEOUT_S) as client:
            yield client
