"""The HTTP listener sheds what a hostile client sends (config `http`, docs/security.md), tried
through the real server: half-sent heads and slow bodies are answered 408 and dropped at their
deadline, a client address past its connection cap is refused while another still gets through,
the total cap holds across addresses, a new MCP session past the session cap is refused in one
sentence while open ones keep working, and an idle session is reaped (its id then answers 404).

Small configured bounds keep each test to seconds; every wait is on a condition with a deadline.
Servers come from support/mcp_http_server.py's http_server() and are stopped by their pid."""

from __future__ import annotations

import json
from contextlib import ExitStack

import httpx2
from support.mcp_http_server import HttpServer, http_server
from support.mcp_session import MCP_TOOLS
from support.raw_http import (
    connect,
    health,
    held_connections,
    read_until_closed,
    request,
    trickle_until_closed,
    wait_for,
)

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "hostile", "version": "1"},
    },
}
ACCEPT = "application/json, text/event-stream"


def bounds(**values: object) -> dict[str, str]:
    """The listener's bounds as WORKER_BRIDGE_HTTP__* variables."""
    return {f"WORKER_BRIDGE_HTTP__{key.upper()}": str(value) for key, value in values.items()}


def port_of(server: HttpServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def initialize(server: HttpServer, token: str | None) -> httpx2.Response:
    headers = {"Accept": ACCEPT, **({"Authorization": f"Bearer {token}"} if token else {})}
    return httpx2.post(f"{server.url}/mcp", json=INIT, headers=headers, timeout=30)


def session_call(
    server: HttpServer, token: str, session: str, method: str | None
) -> httpx2.Response:
    """A request on an open session (a notification when METHOD starts with notifications/,
    DELETE when it is None)."""
    headers = {
        "Accept": ACCEPT,
        "Authorization": f"Bearer {token}",
        "Mcp-Session-Id": session,
        "Mcp-Protocol-Version": "2025-06-18",
    }
    if method is None:
        return httpx2.delete(f"{server.url}/mcp", headers=headers, timeout=30)
    message: dict[str, object] = {"jsonrpc": "2.0", "method": method}
    if not method.startswith("notifications/"):
        message["id"] = 2
    return httpx2.post(f"{server.url}/mcp", json=message, headers=headers, timeout=30)


def result_of(response: httpx2.Response) -> dict:
    """The JSON-RPC result of a response sent as JSON or as one server-sent event."""
    if response.headers["content-type"].startswith("text/event-stream"):
        data = next(line for line in response.text.splitlines() if line.startswith("data:"))
        return json.loads(data.removeprefix("data:"))["result"]
    return response.json()["result"]


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


def message_of(answer: bytes) -> str:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])["message"]


# -- deadlines ---------------------------------------------------------------------------------


def test_half_sent_requests_are_answered_408_and_dropped_at_the_head_deadline(home, token_file):
    env = bounds(head_timeout_s=1, max_connections=400, max_connections_per_client=400)
    with http_server(home, "--token-file", str(token_file), env=env) as server, ExitStack() as s:
        port = port_of(server)
        clients = []
        for n in range(300):
            sock = s.enter_context(connect(port))
            if n % 2:  # half of them send part of a head, the others nothing at all
                sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applic")
            clients.append(sock)
        wait_for(lambda: held_connections(server.proc.pid, port) == 0, "all 300 dropped")
        answers = [read_until_closed(sock) for sock in clients]
        assert status_of(health(port)) == 200, "the server still serves"
        log = (home / "logs" / "mcp-server.log").read_text()

    assert {status_of(a) for a in answers} == {408}
    assert "http.head_timeout_s" in message_of(answers[1]), answers[1]
    dropped = log.count("closed a connection from 127.0.0.1")
    assert 1 <= dropped <= 2, f"{dropped} log lines for 300 drops from one address"


def test_a_body_sent_too_slowly_is_cut_off_at_the_body_deadline(home, token, token_file):
    body = json.dumps(INIT).encode()

    def head(port: int, length: int) -> bytes:
        return (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: {ACCEPT}\r\nAuthorization: Bearer {token}\r\nContent-Length: {length}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()

    with http_server(home, "--token-file", str(token_file), env=bounds(body_timeout_s=1)) as server:
        port = port_of(server)
        with connect(port) as sock:  # the same request sent whole is served
            sock.sendall(head(port, len(body)) + body)
            whole = read_until_closed(sock)
        with connect(port) as sock:
            sock.sendall(head(port, len(body) + 100000) + body[:-1])
            sent = trickle_until_closed(sock, b" ", pace_s=0.2, deadline_s=60)
            answer = read_until_closed(sock)
        assert status_of(health(port)) == 200

    assert status_of(whole) == 200, whole
    assert sent < 100000
    assert status_of(answer) == 408, answer
    assert "http.body_timeout_s" in message_of(answer), answer


def test_a_body_over_its_cap_is_refused_413_whether_declared_or_streamed(home, token, token_file):
    big = {**INIT, "params": {**INIT["params"], "clientInfo": {"name": "x" * 4000, "version": "1"}}}
    payload = json.dumps(big).encode()
    headers = {"Accept": ACCEPT, "Authorization": f"Bearer {token}"}
    with http_server(home, "--token-file", str(token_file), env=bounds(max_body_kb=2)) as server:
        declared = httpx2.post(f"{server.url}/mcp", content=payload, headers=headers)
        streamed = httpx2.post(  # chunked: no Content-Length to refuse it by
            f"{server.url}/mcp", content=iter([payload[:1000], payload[1000:]]), headers=headers
        )
        assert initialize(server, token).status_code == 200, "a body under the cap is served"
        log = (home / "logs" / "mcp-server.log").read_text()

    for answer in (declared, streamed):
        assert answer.status_code == 413, answer.text
        assert "http.max_body_kb" in answer.json()["message"], answer.text
    assert log.count("Created new transport") == 1, "no session for a refused body"


def test_without_the_token_a_request_gets_401_and_its_connection_closed_unread(home, token_file):
    head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10000000\r\n\r\n"
    with http_server(home, "--token-file", str(token_file)) as server:
        with connect(port_of(server)) as sock:
            sock.sendall(head.encode() + b"x" * 1000)  # a body it means to send for ever
            answer = read_until_closed(sock)  # ends: the server closed, not the socket timeout
    assert status_of(answer) == 401, answer
    assert b"connection: close" in answer.lower()


def test_malformed_and_upgrade_requests_cannot_grow_the_log_at_request_speed(home, token_file):
    malformed = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n"
    upgrade = (
        "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    with http_server(home, "--token-file", str(token_file)) as server:
        log_file = home / "logs" / "mcp-server.log"
        before = len(log_file.read_text().splitlines())
        answers = [request(port_of(server), text) for text in [malformed, upgrade] * 200]
        grown = len(log_file.read_text().splitlines()) - before

    assert {status_of(a) for a in answers} == {400, 401}, "refused, not served"
    assert grown <= 10, f"{grown} log lines for 400 refused requests"


# -- connection caps ---------------------------------------------------------------------------


def test_a_client_address_past_its_cap_is_refused_while_another_address_gets_through(
    home, token_file
):
    env = bounds(head_timeout_s=120, max_connections=5, max_connections_per_client=3)
    with http_server(home, "--token-file", str(token_file), env=env) as server, ExitStack() as s:
        port = port_of(server)
        first = [s.enter_context(connect(port, "127.0.0.1")) for _ in range(3)]
        wait_for(lambda: held_connections(server.proc.pid, port) == 3, "three held")
        refused = health(port, "127.0.0.1")
        other = health(port, "127.0.0.2")

        second = [s.enter_context(connect(port, "127.0.0.2")) for _ in range(2)]
        wait_for(lambda: held_connections(server.proc.pid, port) == 5, "five held")
        full = health(port, "127.0.0.3")

        for sock in first + second:
            sock.close()
        wait_for(lambda: held_connections(server.proc.pid, port) == 0, "all released")
        again = health(port, "127.0.0.1")

    assert status_of(refused) == 503, refused
    assert "http.max_connections_per_client" in message_of(refused), refused
    assert status_of(other) == 200, other
    assert status_of(full) == 503 and "http.max_connections)" in message_of(full), full
    assert status_of(again) == 200, "the cap counts open connections, not a ban"


# -- sessions ----------------------------------------------------------------------------------


def test_past_the_session_cap_initialize_is_refused_and_open_sessions_keep_working(
    home, token, token_file
):
    with http_server(home, "--token-file", str(token_file), env=bounds(max_sessions=2)) as server:
        assert {initialize(server, None).status_code for _ in range(20)} == {401}, "no session"
        sessions = [initialize(server, token).headers["mcp-session-id"] for _ in range(2)]
        refused = [initialize(server, token) for _ in range(20)]
        for session in sessions:
            assert session_call(server, token, session, "notifications/initialized").is_success
            listed = session_call(server, token, session, "tools/list")
            assert {t["name"] for t in result_of(listed)["tools"]} == MCP_TOOLS
        ended = session_call(server, token, sessions[0], None)  # DELETE: the client ends it
        # the SDK forgets the session just after answering the DELETE
        wait_for(lambda: initialize(server, token).status_code == 200, "a slot is free again")

    assert {r.status_code for r in refused} == {503}, refused[0].text
    assert refused[0].headers["retry-after"].isdigit()
    message = refused[0].json()["error"]["message"]
    assert "http.max_sessions" in message and "2 MCP sessions" in message, message
    assert message.count(". ") == 0 and message.endswith("."), f"one sentence: {message}"
    assert ended.is_success, ended.text


def test_an_idle_session_is_reaped_and_its_id_then_answers_session_not_found(home, token_file):
    token = token_file.read_text().strip()
    env = bounds(max_sessions=1, session_idle_timeout_s=1)
    with http_server(home, "--token-file", str(token_file), env=env) as server:
        opened = initialize(server, token)
        assert opened.status_code == 200, opened.text
        session = opened.headers["mcp-session-id"]
        # the only slot is held until the session is reaped; nothing touches it meanwhile
        wait_for(lambda: initialize(server, token).status_code == 200, "the idle one reaped")
        stale = session_call(server, token, session, "tools/list")
    assert stale.status_code == 404, stale.text
    assert stale.json()["error"]["message"] == "Session not found"


def test_the_bounds_come_from_config_yaml_too(home, token_file):
    (home / "config.yaml").write_text("http:\n  max_connections_per_client: 1\n")
    with http_server(home, "--token-file", str(token_file)) as server:
        with connect(port_of(server)):
            wait_for(lambda: held_connections(server.proc.pid, port_of(server)) == 1, "held")
            refused = health(port_of(server))
    assert status_of(refused) == 503, refused
