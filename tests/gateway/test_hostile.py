"""The gateway as a malicious worker attacks it (adopted from the hostile review of issue 18's
change): code in the sandbox, reaching only its gateway's sockets, tries to grow the gateway's
memory past its budget (answers held whole, streams never read), to get a path off a route's
list to the upstream (encodings, absolute forms, fragments, a body framed twice, pipelining, a
redirect), to starve a model call with slow drips, and to flood a task's event log across a
repair turn. Memory is measured from outside, on a process hosting only a gateway
(tests/support/gateway_host.py)."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import unquote

import pytest
from support.gateway_host import GatewayHost
from support.gateway_sockets import Events, built_in_routes, gateway, http, request, status_of
from support.hostile_upstream import HostileUpstream
from support.tasks import mock_task

from bridge import WorkerBridge
from bridge.gateway.server import ROUTES_SOCKET

BUDGET_MB = 48  # gateway.memory_budget_mb's default
SLACK_MB = 16  # the interpreter, aiohttp's pools, the sockets: what the existing flood shows


@pytest.fixture
def hostile():
    server = HostileUpstream().start()
    yield server
    server.stop()


# -- memory -------------------------------------------------------------------------------------


def _memory_flood(host: GatewayHost, target: bytes, connections: int, read_first: int) -> dict:
    """``connections`` sandboxes each GET ``target``, read ``read_first`` bytes of the answer,
    and wait for one another there (so every exchange is in flight at once) before reading the
    rest; returns the bytes each got and the host's resident memory at the rendezvous."""
    barrier = threading.Barrier(connections + 1, timeout=120)
    got: list[int] = []

    def one() -> None:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(120)
            s.connect(str(host.folder / ROUTES_SOCKET))
            s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            seen = 0
            while seen < read_first and (chunk := s.recv(65536)):
                seen += len(chunk)
            barrier.wait()
            barrier.wait()
            while chunk := s.recv(65536):
                seen += len(chunk)
            got.append(seen)

    threads = [threading.Thread(target=one) for _ in range(connections)]
    for thread in threads:
        thread.start()
    barrier.wait()
    time.sleep(0.5)
    at_rendezvous = host.rss()
    barrier.wait()
    for thread in threads:
        thread.join(120)
    return {"got": got, "rss": at_rendezvous}


def test_non_streamed_answers_on_every_connection_keep_the_gateway_within_its_budget(
    workdir, hostile
):
    host = GatewayHost(workdir / "gw", {"b": [hostile.url, None]}, max_events=10)
    try:
        flood = _memory_flood(host, b"/b/v1/big-json?mb=4", 64, 4 * 2**20 - 2**19)
    finally:
        host.stop()
    assert len(flood["got"]) == 64 and min(flood["got"]) > 4 * 2**20, "every answer arrived"
    grown = max(host.peak, flood["rss"]) - host.idle
    assert grown < (BUDGET_MB + SLACK_MB) * 2**20, f"grew {grown / 2**20:.0f} MiB"


def test_sandboxes_that_never_read_a_fast_stream_keep_the_gateway_within_its_budget(
    workdir, hostile
):
    host = GatewayHost(workdir / "gw", {"b": [hostile.url, None]}, max_events=10)
    socks = []
    try:
        for _ in range(64):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(host.folder / ROUTES_SOCKET))
            s.sendall(b"GET /b/v1/fast-sse HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(s)
        time.sleep(6)  # the upstream writes as fast as it can meanwhile
        grown = host.peak - host.idle
    finally:
        for s in socks:
            s.close()
        host.stop()
    assert grown < (BUDGET_MB + SLACK_MB) * 2**20, f"grew {grown / 2**20:.0f} MiB"


# -- what reaches the upstream ------------------------------------------------------------------


# Targets on the built-in anthropic route (its list: POST /v1/messages, .../count_tokens).
HOSTILE_TARGETS = [
    b"/anthropic/v1/messages%00",
    b"/anthropic/v1/messages%00/../files",
    b"http://api.anthropic.com/anthropic/v1/messages",
    b"http://127.0.0.1/anthropic/v1/files",
    b"*",
    b"/anthropic/v1/files#/v1/messages",
    b"/anthropic/v1/messages#x",
    b"/anthropic/v1/files?/v1/messages",
    b"/anthropic/v1/messages/",
    b"/anthropic/V1/messages",
    b"/anthropic/v1/messages%3F/../files",
    b"/anthropic/v1/messages%23/../files",
    b"/anthropic/v1/messages%2F..%2Ffiles",
    b"/anthropic/v1/messages%2f..%2ffiles",
    b"/anthropic/v1/%6d%65ssages",  # the same path, spelled with escapes: may go through
    b"/anthropic/v1/%6D%65SSAGES",
    b"/%61nthropic/v1/messages",
    b"/anthropic/v1/messages%E2%80%8B",  # a zero-width space after the path
    b"/anthropic/v1/messages%C0%AF..%C0%AFfiles",
    b"/anthropic/v1/messages/count_tokens/..",
    b"/anthropic//v1/messages",
    b"/anthropic/v1/messages?x=%2F..%2Ffiles",
    b"/anthropic/v1/messages\t",
]


def test_whatever_a_route_lets_through_the_upstream_reads_as_a_listed_path(workdir, upstream):
    gw = gateway(workdir / "gw", upstream, Events())
    gw.routes.update(built_in_routes(upstream))
    statuses = {}
    try:
        for target in HOSTILE_TARGETS:
            raw = b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            raw += b"Content-Length: 2\r\n\r\n{}"
            statuses[target] = status_of(request(gw.folder / ROUTES_SOCKET, raw))
        lower = request(gw.folder / ROUTES_SOCKET, http("post", "/anthropic/v1/messages", b"{}"))
    finally:
        gw.stop()
    assert status_of(lower) == 403, "a lower-case method is not on the list"
    through = [t for t, status in statuses.items() if status == 200]
    assert len(through) == len(upstream.requests)
    for seen in upstream.requests:
        path = unquote(seen.path.split("?", 1)[0])
        assert (seen.method, path) == ("POST", "/v1/messages"), seen.path
    assert all(status in (200, 400, 403, 404) for status in statuses.values()), statuses


def test_a_body_framed_twice_cannot_smuggle_a_second_request_to_the_upstream(workdir, upstream):
    """Content-Length and chunked together: the upstream gets one request (the gateway's
    Content-Length, which its client keeps to), and a repeated or signed length is refused."""
    gw = gateway(workdir / "gw", upstream, Events())
    gw.routes.update(built_in_routes(upstream))
    smuggled = b"GET /v1/organizations/users HTTP/1.1\r\nHost: x\r\n\r\n"
    body = b"{}" + smuggled
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = b"POST /anthropic/v1/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    try:
        both = request(
            gw.folder / ROUTES_SOCKET,
            head + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        )
        twice = request(
            gw.folder / ROUTES_SOCKET,
            head + b"Content-Length: 2\r\nContent-Length: 53\r\n\r\n" + body,
        )
        signed = request(gw.folder / ROUTES_SOCKET, head + b"Content-Length: +2\r\n\r\n{}")
        time.sleep(0.5)
    finally:
        gw.stop()
    assert status_of(both) == 200 and [r.body for r in upstream.requests] == [b"{}"]
    assert [r.path for r in upstream.requests] == ["/v1/messages"]
    assert status_of(twice) == 400 and status_of(signed) == 400


def test_the_key_never_reaches_an_unlisted_path_through_pipelining_or_a_redirect(workdir, upstream):
    """Two requests in one write, the second off the list; and an upstream redirect is handed
    to the sandbox, not followed with the key."""
    gw = gateway(workdir / "gw", upstream, Events())
    gw.routes.update(built_in_routes(upstream))
    first = b"POST /anthropic/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    second = b"GET /anthropic/v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    try:
        answers = request(gw.folder / ROUTES_SOCKET, first + second)
    finally:
        gw.stop()
    assert answers.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 403" in answers
    assert [r.path for r in upstream.requests] == ["/v1/messages"]


def test_a_budget_held_by_slow_drips_frees_in_bounded_time_and_a_model_call_then_goes_through(
    workdir, upstream
):
    """Every grant of a small budget taken by connections that drip their heads: a model call
    queued behind them is answered once their read deadline passes, not never."""
    from bridge.gateway.exchange import EXCHANGE_BYTES

    gw = gateway(workdir / "gw", upstream, Events(), memory_budget_mb=1, read_deadline_s=2.0)
    drips = []
    try:
        for _ in range(gw.budget.capacity // EXCHANGE_BYTES):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(30)
            s.connect(str(gw.folder / ROUTES_SOCKET))
            s.sendall(b"POST /test/v1/x HTTP/1.1\r\n")
            drips.append(s)
        deadline = time.monotonic() + 10
        while gw.budget.free >= EXCHANGE_BYTES and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gw.budget.free < EXCHANGE_BYTES, "the drips hold the whole budget"
        answer = request(gw.folder / ROUTES_SOCKET, http("POST", "/test/v1/x", b"{}"), timeout=30)
    finally:
        for s in drips:
            s.close()
        gw.stop()
    assert status_of(answer) == 200


# -- the task's event log -----------------------------------------------------------------------


def test_network_events_stay_within_max_events_per_task_across_a_repair_turn(
    workdir, home, repo, docker_images
):
    (home / "config.yaml").write_text("gateway:\n  max_events: 10\nauto_repair: 1\n")
    flood = (
        'python3 -c "import os,socket\n'
        "for i in range(40):\n"
        "    s=socket.create_connection(('127.0.0.1',7801)); "
        "s.sendall(b'GET http://not-listed.example/x HTTP/1.1\\\\r\\\\nHost: x\\\\r\\\\n"
        "Connection: close\\\\r\\\\n\\\\r\\\\n'); s.recv(4096); s.close()\""
    )
    spec = mock_task(
        repo,
        {"script": flood, "on_follow_up": {"script": flood}},
        verify=["false"],
        network={"mode": "allowlist", "domains": ["listed.example"]},
    )
    bridge = WorkerBridge(home=home)
    try:
        result = bridge.run_task(bridge.create_task(spec).task_id)
        events = [e.document() for e in bridge.task_logs(result.task_id, limit=10_000).events]
    finally:
        bridge.close()
    turns = [e for e in events if e["kind"] == "worker.started"]
    assert len(turns) == 2, "the failed verification gave the worker a repair turn"
    network = [e for e in events if e["kind"].startswith("network.")]
    assert len(network) <= 10 + 1, f"{len(network)} network events for max_events 10"
