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
import secrets
import subprocess
from pathlib import Path

import httpx2
import pytest
from support.cli import CLI, MCP_SERVER
from support.mcp_http_server import free_port, http_client, http_server
from support.mcp_session import (
    MCP_TOOLS,
    call,
    call_error,
    delegate,
    mcp_server,
    server_env,
    wait_status,
)

from bridge.errors import ConfigError
from bridge.listener import flags as listener_flags
from bridge.listener.options import HttpOptions, resolve_options
from bridge.version import __version__

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_task_outlives_the_test")]


# -- helpers -----------------------------------------------------------------------------------


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
            challenge = response.headers["www-authenticate"]
            assert challenge.startswith("Bearer "), response.headers
            # What a client shows: a static token, not OAuth (RFC 6750's error_description).
            assert 'error_description="This server takes a static bearer token' in challenge
            assert "not OAuth" in response.json()["message"]
            assert token not in response.text
        # A client that met the 401 and looks for OAuth is told there is none, and why.
        for path in ("oauth-protected-resource/mcp", "oauth-authorization-server"):
            discovery = httpx2.get(f"{server.url}/.well-known/{path}")
            assert discovery.status_code == 404, discovery.text
            assert "static bearer token, not OAuth" in discovery.json()["message"]

        async with http_client(server.url, token) as client:  # the right token gets in
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
        async with http_client(server.url, token) as client:
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
        async with http_client(server.url, token) as client:
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
    stderr = refused_to_start([*MCP_SERVER, "--http", f"0.0.0.0:{port}"], home)
    assert "--token-file" in stderr and "WORKER_BRIDGE_MCP_TOKEN" in stderr, stderr

    stderr = refused_to_start([*CLI, "mcp", "--http", f"0.0.0.0:{port}", "--no-token"], home)
    assert "loopback" in stderr, stderr


def options(*argv: str, env: dict[str, str] | None = None) -> HttpOptions | None:
    parser = argparse.ArgumentParser()
    listener_flags.add_arguments(parser)
    return resolve_options(parser.parse_args(argv), env if env is not None else {})


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
        async with http_client(server.url, None) as client:
            assert {t.name for t in (await client.list_tools()).tools} == MCP_TOOLS
        log = server.log_text()
    assert "WITHOUT a bearer token" in log, log
