"""The HTTP transport as a hostile network client tries it (adopted from a hostile review's
proofs of concept): no path, method or header trick passes the token gate; a client without the
token can neither forge log lines nor grow the log at request speed, nor fake the peer it is
logged as; a loopback server refuses requests naming a foreign host (DNS rebinding) on every
loopback address. Every server is started by support/mcp_http_server.py's http_server() (a free
port on loopback, its own state root) and stopped by its pid."""

from __future__ import annotations

import os
import socket
import urllib.parse
from pathlib import Path

import httpx2
from support.cli import MCP_SERVER
from support.mcp_http_server import free_port, http_server
from support.mcp_session import server_env

INIT = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
    b'"capabilities":{},"clientInfo":{"name":"poc","version":"1"}}}'
)
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
TOKEN = "review2-" + "ab" * 20


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def _raw(url: str, request: bytes) -> bytes:
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(200)


# --- what holds -----------------------------------------------------------------------------


def test_no_path_method_or_header_trick_passes_the_gate(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with http_server(home, "--token-file", str(_token_file(tmp_path))) as server:
        for path in ("/mcp", "//mcp", "/mcp/", "/healthz/../mcp", "/healthz/%2e%2e/mcp", "/MCP"):
            for method in ("POST", "GET", "HEAD", "OPTIONS", "PUT", "DELETE"):
                req = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
                assert b" 401 " in _raw(server.url, req.encode()), (method, path)
        for value in (
            f"Bearer\t{TOKEN}",
            f"Bearer {TOKEN}x",
            f"Bearer {TOKEN[:-1]}",
            f"Basic {TOKEN}",
            f"Bearer {TOKEN} {TOKEN}",
        ):
            answer = httpx2.post(
                f"{server.url}/mcp", content=INIT, headers={**MCP_HEADERS, "Authorization": value}
            )
            assert answer.status_code == 401, value[:40]
        # a 60 KB token: past the HTTP parser's header limit, refused before the gate (400), or
        # the connection closed while it was still being sent
        try:
            status = httpx2.post(
                f"{server.url}/mcp",
                content=INIT,
                headers={**MCP_HEADERS, "Authorization": "Bearer " + "a" * 60000},
            ).status_code
        except httpx2.TransportError:
            status = 400
        assert status in (400, 401, 431)
        # a wrong token first and the right one second: the first header is the one judged
        both = f"Authorization: Bearer nope\r\nAuthorization: Bearer {TOKEN}\r\n"
        req = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{both}Content-Length: 0\r\n\r\n"
        assert b" 401 " in _raw(server.url, req.encode())
        # oversized headers are refused by the HTTP parser and the server stays up
        big = b"POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"a" * 2_000_000
        try:
            answer = _raw(server.url, big + b"\r\n\r\n")
        except (ConnectionResetError, BrokenPipeError):
            answer = b" 400 "  # it answered and closed while the rest was still being sent
        assert b" 400 " in answer
        assert httpx2.get(f"{server.url}/healthz").status_code == 200
        assert TOKEN not in server.log_text()


# --- findings -------------------------------------------------------------------------------


def test_an_unauthenticated_path_cannot_forge_log_lines(tmp_path: Path) -> None:
    home = tmp_path / "home"
    forged = "2026-01-01 00:00:00,000 worker_bridge.mcp INFO token accepted for admin"
    with http_server(home, "--token-file", str(_token_file(tmp_path))) as server:
        path = "/x" + urllib.parse.quote("\n" + forged + "\x1b[2J")
        req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        assert b" 401 " in _raw(server.url, req.encode())
        lines = server.log_text().splitlines()
    assert not any(line.startswith(forged) for line in lines), "a forged line in the log"
    assert "\x1b" not in "\n".join(lines), "a terminal escape in the log"


def test_unauthenticated_requests_cannot_grow_the_log_without_bound(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with http_server(home, "--token-file", str(_token_file(tmp_path))) as server:
        log_file = home / "logs" / "mcp-server.log"
        before = log_file.stat().st_size
        host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
        req = b"GET /" + b"A" * 15000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        for _ in range(300):  # a refusal closes its connection: one connection per request
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(req)
                got = b""
                while chunk := sock.recv(4096):
                    got += chunk
                assert b" 401 " in got, got[:100]
        grown = log_file.stat().st_size - before
    # 300 requests, ~0.2 s: 4.5 MB in the file and as much again on stderr (docker logs)
    assert grown < 1_000_000, f"{grown} bytes logged for 300 unauthenticated requests"


def test_no_token_on_any_loopback_address_refuses_a_foreign_host(tmp_path: Path) -> None:
    """DNS rebinding: a web page whose name resolves to 127.0.0.2 is same-origin with the
    bridge. The SDK turns its Host/Origin check on only for the literal hosts 127.0.0.1,
    localhost and ::1, while --no-token is allowed on all of 127.0.0.0/8 and any spelling of
    ::1 ([0:0:0:0:0:0:0:1])."""
    import subprocess
    import time

    home = tmp_path / "home"
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*MCP_SERVER, "--http", f"127.0.0.2:{port}", "--no-token"],
            env=server_env(home),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        url = f"http://127.0.0.2:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx2.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        rebound = {**MCP_HEADERS, "Host": "evil.example:80", "Origin": "http://evil.example"}
        answer = httpx2.post(f"{url}/mcp", content=INIT, headers=rebound)
    finally:
        os.kill(proc.pid, 15)
        proc.wait(timeout=15)
    assert answer.status_code in (403, 421), f"served a rebound Host: {answer.status_code}"


def test_the_refusal_log_names_the_real_peer(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with http_server(home, "--token-file", str(_token_file(tmp_path))) as server:
        httpx2.get(f"{server.url}/mcp", headers={"X-Forwarded-For": "203.0.113.66"})
        text = server.log_text()
    assert "203.0.113.66" not in text
