"""`worker-bridge-mcp --http` as a network client sees it: the server started as a subprocess on
127.0.0.1 (a free port, its own state root), driven with the SDK's streamable HTTP client.

Covered: the health endpoint answers without a token and nothing else does (401 with
`WWW-Authenticate: Bearer`, the refusal logged without the token); the tool listing and a tool
error are the same as on stdio; a mock task is delegated, polled and accepted into the
repository; the server refuses to start without a token off loopback, on a bad address or an
empty token file, and runs tokenless on loopback only when told to, saying so in its log.

Every server is stopped by its pid in teardown (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from conftest import MCP_TOOLS
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from test_mcp import (  # noqa: F401  (the fixture cancels tasks left running)
    REQUEST_TIMEOUT_S,
    SERVER,
    call,
    call_error,
    delegate,
    mcp_server,
    no_task_outlives_the_test,
    wait_status,
)

from bridge import mcp_http
from bridge.errors import ConfigError
from bridge.version import __version__

CLI_SCRIPT = Path(sys.executable).parent / "worker-bridge"
CLI = [str(CLI_SCRIPT)] if CLI_SCRIPT.exists() else [sys.executable, "-m", "bridge.cli"]
TOKEN_VARS = ("WORKER_BRIDGE_MCP_TOKEN", "WORKER_BRIDGE_MCP_TOKEN_FILE")
START_DEADLINE_S = 30
POLL = 0.1

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def token() -> str:
    return secrets.token_hex(24)


@pytest.fixture
def token_file(workdir: Path, token: str) -> Path:
    path = workdir / "mcp-token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


# -- helpers -----------------------------------------------------------------------------------


def server_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test's state root, and no token but the ones a test passes on purpose."""
    env = {k: v for k, v in os.environ.items() if k not in TOKEN_VARS}
    return {**env, "WORKER_BRIDGE_HOME": str(home), **(extra or {})}


def free_port() -> int:
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
    port = free_port()
    stderr_path = home.parent / f"mcp-http-{port}.log"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [*SERVER, "--http", f"127.0.0.1:{port}", *args],
            env=server_env(home, env),
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
        )
    server = HttpServer(proc, f"http://127.0.0.1:{port}", home, stderr_path)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not _healthy(server.url):
            assert proc.poll() is None, f"the server exited {proc.returncode}: {server.log_text()}"
            assert time.monotonic() < deadline, f"no /healthz answer: {server.log_text()}"
            time.sleep(POLL)
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
async def http_client(server: HttpServer, token: str | None) -> AsyncIterator[Client]:
    """An initialised SDK client session over streamable HTTP, sending the bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx2.Timeout(30, read=300)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        transport = streamable_http_client(f"{server.url}/mcp", http_client=http)
        async with Client(transport, read_timeout_seconds=REQUEST_TIMEOUT_S) as client:
            yield client


def refused_to_start(command: list[str], home: Path, env: dict[str, str] | None = None) -> str:
    """Run a server command that must exit 2 at once; returns its stderr."""
    proc = subprocess.run(
        command, env=server_env(home, env), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, (command, proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0, f"one line: {proc.stderr!r}"
    return proc.stderr


# -- the gate ----------------------------------------------------------------------------------


async def test_health_answers_without_a_token_and_everything_else_wants_it(home, token, token_file):
    wrong = secrets.token_hex(24)
    mcp_post = {"json": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}}
    with http_server(home, "--token-file", str(token_file)) as server:
        health = httpx2.get(f"{server.url}/healthz")
        assert health.status_code == 200
        assert health.json() == {"ok": True, "version": __version__}

        missing = httpx2.post(f"{server.url}/mcp", **mcp_post)
        bad = httpx2.post(f"{server.url}/mcp", headers={"Authorization": f"Bearer {wrong}"})
        basic = httpx2.post(f"{server.url}/mcp", headers={"Authorization": f"Basic {token}"})
        elsewhere = [httpx2.get(f"{server.url}/"), httpx2.post(f"{server.url}/healthz")]
        for response in [missing, bad, basic, *elsewhere]:
            assert response.status_code == 401, (response.request.url, response.text)
            assert response.headers["www-authenticate"].startswith("Bearer "), response.headers
            assert token not in response.text

        async with http_client(server, token) as client:  # the right token gets in
            assert {t.name for t in (await client.list_tools()).tools} == MCP_TOOLS
        log = server.log_text()

    assert "refused POST /mcp from 127.0.0.1:" in log, log
    assert "missing bearer token" in log and "wrong bearer token" in log, log
    assert "malformed Authorization header" in log, log
    assert token not in log and wrong not in log, "no token text in the log"
    assert "token from --token-file" in log, "the log says where the token came from"


async def test_tools_and_tool_errors_are_the_same_as_on_stdio(home, token):
    async with mcp_server(home) as stdio:
        stdio_tools = {t.name: t for t in (await stdio.list_tools()).tools}
        stdio_error = await call_error(stdio, "worker_status", {"task_id": "no-such-task"})

    with http_server(home, env={"WORKER_BRIDGE_MCP_TOKEN": token}) as server:
        async with http_client(server, token) as client:
            http_tools = {t.name: t for t in (await client.list_tools()).tools}
            http_error = await call_error(client, "worker_status", {"task_id": "no-such-task"})
            listing = await call(client, "list_workers")  # the server is still healthy
        log = server.log_text()

    assert set(http_tools) == set(stdio_tools) == MCP_TOOLS
    for name, tool in http_tools.items():
        assert tool.description == stdio_tools[name].description, name
        assert tool.input_schema == stdio_tools[name].input_schema, name
    assert http_error == stdio_error and "no-such-task" in http_error
    assert "mock" in {w["name"] for w in listing["workers"]}
    assert token not in log and "token from $WORKER_BRIDGE_MCP_TOKEN" in log, log


async def test_a_mock_task_is_delegated_polled_and_accepted_over_http(
    home, repo, token, token_file, docker_images
):
    mock = {"write": {"hello.txt": "hello over http\n"}, "summary": "wrote hello.txt"}
    with http_server(home, "--token-file", str(token_file)) as server:
        async with http_client(server, token) as client:
            queued = await delegate(client, repo, mock, verify=["test -f hello.txt"])
            assert queued["status"] in {"queued", "running"}, queued
            result = await wait_status(client, queued["task_id"], deadline_s=90)
            assert result["status"] == "succeeded", result["error"]
            assert result["verification"]["ok"] is True, result["verification"]
            assert (repo / "hello.txt").exists() is False, "nothing changes before accept"
            accepted = await call(client, "worker_accept", {"task_id": queued["task_id"]})

    assert accepted["accepted"] is True, accepted
    assert "hello.txt" in accepted["applied"], accepted
    assert (repo / "hello.txt").read_text() == "hello over http\n"


# -- starting ----------------------------------------------------------------------------------


async def test_it_refuses_to_start_without_a_token_off_loopback(home):
    port = str(free_port())
    stderr = refused_to_start([*SERVER, "--http", f"0.0.0.0:{port}"], home)
    assert "--token-file" in stderr and "WORKER_BRIDGE_MCP_TOKEN" in stderr, stderr

    stderr = refused_to_start([*CLI, "mcp", "--http", f"0.0.0.0:{port}", "--no-token"], home)
    assert "loopback" in stderr, stderr


def options(*argv: str, env: dict[str, str] | None = None) -> mcp_http.HttpOptions | None:
    parser = argparse.ArgumentParser()
    mcp_http.add_arguments(parser)
    return mcp_http.resolve_options(parser.parse_args(argv), env if env is not None else {})


@pytest.mark.parametrize(
    "bind", ["8765", ":8765", "0.0.0.0", "0.0.0.0:0", "0.0.0.0:65536", "::1:8765", "a_b:1", "[x]:1"]
)
def test_a_bind_address_that_is_not_host_port_is_refused(bind):
    with pytest.raises(ConfigError, match="HOST:PORT"):
        options("--http", bind, "--no-token")


def test_bind_addresses_and_token_sources_are_checked_before_anything_starts(workdir, token):
    assert options() is None, "no --http: stdio"
    assert options("--http", "[::1]:8765", "--no-token").host == "::1"
    assert options("--http", "localhost:1", "--no-token").token is None
    with pytest.raises(ConfigError, match="only with --http"):
        options("--no-token")
    with pytest.raises(ConfigError, match="but so was a token"):
        options("--http", "127.0.0.1:1", "--no-token", env={"WORKER_BRIDGE_MCP_TOKEN": token})

    env = {"WORKER_BRIDGE_MCP_TOKEN": f" {token}\n"}
    got = options("--http", "0.0.0.0:8765", env=env)
    assert (got.host, got.port, got.token) == ("0.0.0.0", 8765, token)
    assert env == {}, "the token is taken out of the environment children inherit"
    assert token not in repr(got)

    path = workdir / "token"
    for text, error in [(None, "does not exist"), ("\n", "is empty"), ("two words", "one word")]:
        if text is not None:
            path.write_text(text)
        with pytest.raises(ConfigError, match=error):
            options("--http", "0.0.0.0:1", "--token-file", str(path))
    path.write_text(token)
    path.chmod(0o644)
    got = options("--http", "0.0.0.0:1", env={"WORKER_BRIDGE_MCP_TOKEN_FILE": str(path)})
    assert got.token == token and "chmod 600" in got.warnings[0], got.warnings
    path.chmod(0o600)
    assert options("--http", "0.0.0.0:1", "--token-file", str(path)).warnings == ()


async def test_loopback_runs_without_a_token_only_when_told_and_says_so(home):
    with http_server(home, "--no-token") as server:
        async with http_client(server, None) as client:
            assert {t.name for t in (await client.list_tools()).tools} == MCP_TOOLS
        log = server.log_text()
    assert "WITHOUT a bearer token" in log, log
