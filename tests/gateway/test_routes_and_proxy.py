"""The gateway on its own (no engine): a test upstream on loopback, and clients on the gateway's
Unix sockets playing the sandbox. Through the engine (relay, no interface but lo, the key nowhere
inside): tests/gateway/test_network.py."""

from __future__ import annotations

import json
import socket
import time

import pytest
from support.gateway_sockets import (
    KEY,
    Events,
    body_of,
    built_in_routes,
    connect,
    gateway,
    http,
    localhost_gateway,
    request,
    status_of,
)
from support.waiting import poll

from bridge.config.settings import GatewayConfig, RouteConfig, load_config
from bridge.errors import InvalidSpec
from bridge.gateway.policy import Route, address_refusal, check_domains, name_allowed
from bridge.gateway.server import PROXY_SOCKET, ROUTES_SOCKET, Gateway


def test_a_route_gets_the_real_key_and_the_sandboxs_credential_is_dropped(workdir, upstream):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events)
    try:
        answer = request(
            gw.folder / ROUTES_SOCKET,
            http(
                "POST",
                "/test/v1/messages",
                b'{"model": "claude-x"}',
                {"x-api-key": "placeholder", "Authorization": "Bearer placeholder"},
            ),
        )
    finally:
        gw.stop()
    assert status_of(answer) == 200
    seen = upstream.requests[-1]
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == KEY
    assert "authorization" not in seen.headers  # the placeholder bearer never left
    [logged] = events.of("network.request")
    # Filed under the model the upstream says served, not the one the sandbox named.
    assert logged["route"] == "test" and logged["status"] == 200
    assert logged["model"] == "served-claude-x"
    assert (logged["input_tokens"], logged["output_tokens"]) == (11, 7)
    assert gw.usage.tokens == {"served-claude-x": {"input": 11, "output": 7}}
    assert not (gw.folder / ROUTES_SOCKET).exists() and not (gw.folder / PROXY_SOCKET).exists()


def test_a_key_refused_on_a_route_is_final_for_the_sandbox(workdir, upstream):
    gw = gateway(workdir / "gw", upstream, Events())
    try:
        answer = request(gw.folder / ROUTES_SOCKET, http("POST", "/test/v1/refuse", b"{}"))
    finally:
        gw.stop()
    assert status_of(answer) == 401
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.count(b"x-should-retry") == 1 and b"x-should-retry: false" in head


def test_a_streamed_answer_reaches_the_sandbox_chunk_by_chunk(workdir, upstream):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(gw.folder / ROUTES_SOCKET))
            s.sendall(http("POST", "/test/v1/held", b'{"model": "m"}'))
            first = b""
            while b"data: first" not in first:
                first += s.recv(65536)
            assert b"data: last" not in first  # the upstream has not sent it yet
            upstream.release.set()
            rest = b""
            while chunk := s.recv(65536):
                rest += chunk
            assert b"data: last" in rest
    finally:
        gw.stop()


def test_token_usage_is_read_from_a_server_sent_event_stream(workdir, upstream):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events)
    try:
        answer = request(
            gw.folder / ROUTES_SOCKET, http("POST", "/test/v1/sse", b'{"model": "m2"}')
        )
    finally:
        gw.stop()
    assert b"message_stop" in answer
    assert gw.usage.tokens == {"served-m2": {"input": 21, "output": 9}}


@pytest.mark.parametrize(
    ("target", "body", "status", "reason"),
    [
        ("/nope/v1/x", b"", 404, "no gateway route 'nope'"),
        ("/test/v1/x", b"x" * (2 * 2**20), 413, "gateway.max_request_mb"),
    ],
)
def test_bad_requests_get_a_clear_answer_and_the_gateway_stays_up(
    workdir, upstream, target, body, status, reason
):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events, max_request_mb=1)
    try:
        answer = request(gw.folder / ROUTES_SOCKET, http("POST", target, body))
        assert status_of(answer) == status
        assert reason in body_of(answer).decode()
        garbage = request(gw.folder / ROUTES_SOCKET, b"NOT HTTP AT ALL\r\n\r\n")
        assert status_of(garbage) == 400
        ok = request(gw.folder / ROUTES_SOCKET, http("GET", "/test/v1/fine"))
        assert status_of(ok) == 200  # still serving
    finally:
        gw.stop()
    assert events.of("network.refused")


def test_an_upstream_that_is_down_or_slow_gives_502_or_504_with_the_reason(workdir, upstream):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events, idle_timeout_s=1, total_timeout_s=2)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    gw.routes["down"] = Route("down", f"http://127.0.0.1:{port}", "bearer", None, None)
    try:
        down = request(gw.folder / ROUTES_SOCKET, http("GET", "/down/v1/x"))
        slow = request(gw.folder / ROUTES_SOCKET, http("GET", "/test/v1/slow"))
    finally:
        gw.stop()
    assert status_of(down) == 502 and b"unreachable" in body_of(down)
    assert status_of(slow) == 504 and b"too slow" in body_of(slow)
    errors = [e.get("error", "") for e in events.of("network.request")]
    assert any("unreachable" in e for e in errors) and any("slow" in e for e in errors)


# -- the allowlist proxy ------------------------------------------------------------------------


def test_a_listed_name_tunnels_and_others_are_refused(workdir, upstream):
    events = Events()
    gw = localhost_gateway(workdir / "gw", upstream, events, trusted=["127.0.0.0/8", "::1/128"])
    try:
        tunneled = connect(
            gw.folder / PROXY_SOCKET, "localhost", upstream.port, http("GET", "/via")
        )
        unlisted = connect(gw.folder / PROXY_SOCKET, "example.com", upstream.port, b"")
        port = connect(gw.folder / PROXY_SOCKET, "localhost", 22, b"")
        plain = request(
            gw.folder / PROXY_SOCKET, http("GET", f"http://localhost:{upstream.port}/plain")
        )
    finally:
        gw.stop()
    assert b"200" in tunneled.split(b"\r\n", 1)[0] and b'"path": "/via"' in tunneled
    assert status_of(unlisted) == 403 and b"not in this task's network.domains" in unlisted
    assert status_of(port) == 403 and b"port 22" in port and b"connect_ports" in port
    assert status_of(plain) == 200 and upstream.requests[-1].path == "/plain"
    refused = events.of("network.refused")
    assert {r["host"] for r in refused} == {"example.com", "localhost"}
    assert any(e.get("method") == "CONNECT" for e in events.of("network.request"))


def test_a_listed_name_on_a_private_address_is_refused_unless_trusted(workdir, upstream):
    events = Events()
    gw = localhost_gateway(workdir / "gw", upstream, events, trusted=())
    try:
        refused = connect(gw.folder / PROXY_SOCKET, "localhost", upstream.port, b"")
    finally:
        gw.stop()
    assert status_of(refused) == 403 and b"loopback" in refused
    assert "loopback" in events.of("network.refused")[0]["reason"]


def test_general_egress_is_closed_without_an_allowlist(workdir, upstream):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events, allowlist=None)
    try:
        refused = connect(gw.folder / PROXY_SOCKET, "localhost", 443, b"")
    finally:
        gw.stop()
    assert status_of(refused) == 403 and b"network.mode is none" in refused


# -- policy -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.1.1", "private"),
        ("172.20.0.1", "private"),
        ("100.64.1.1", "private"),
        ("169.254.169.254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fd00:ec2::254", "metadata"),
        ("::ffff:127.0.0.1", "loopback"),
        ("0.0.0.0", "not a public"),
    ],
)
def test_addresses_that_are_never_egress_targets(address, why):
    assert why in (address_refusal(address, []) or "")


def test_a_public_address_may_be_reached_and_a_trusted_range_too():
    import ipaddress

    assert address_refusal("93.184.215.14", []) is None
    assert address_refusal("127.0.0.1", [ipaddress.ip_network("127.0.0.0/8")]) is None


def test_domain_patterns_are_checked_and_matched():
    assert check_domains(["Example.COM", "*.pypi.org"]) == ["example.com", "*.pypi.org"]
    for bad in ("https://x.com", "x.com:443", "10.0.0.1", "*", "*.com.", "a..b"):
        with pytest.raises(InvalidSpec, match="network.domains"):
            check_domains([bad])
    assert name_allowed("files.pypi.org", ["*.pypi.org"])
    assert not name_allowed("pypi.org", ["*.pypi.org"])
    assert not name_allowed("evilpypi.org", ["*.pypi.org"])
    assert name_allowed("example.com.", ["example.com"])


def test_a_route_needing_a_missing_credential_is_refused_at_creation_naming_it(home, repo):
    from bridge import WorkerBridge

    (home / "config.yaml").write_text(
        "allow_mock_routes: true\n"
        "gateway:\n  routes:\n    mine:\n      upstream: http://127.0.0.1:9\n"
        "      auth: bearer\n      key_env: WB_TEST_MISSING_KEY\n"
    )
    bridge = WorkerBridge(home=home)
    spec = {
        "objective": "x",
        "workspace": {"repository": str(repo)},
        "metadata": {"mock": {"routes": ["mine"]}},
    }
    with pytest.raises(InvalidSpec, match="WB_TEST_MISSING_KEY"):
        bridge.create_task(spec)
    spec["metadata"]["mock"]["routes"] = ["absent"]
    with pytest.raises(InvalidSpec, match="Unknown gateway route 'absent'"):
        bridge.create_task(spec)
    bad = {**spec, "metadata": {}, "network": {"mode": "allowlist", "domains": ["http://x"]}}
    with pytest.raises(InvalidSpec, match="network.domains"):
        bridge.create_task(bad)
    assert bridge.list_tasks() == []
    bridge.close()


def test_mock_routes_are_refused_at_creation_unless_the_owner_allows_them(home, repo, monkeypatch):
    from bridge import WorkerBridge
    from bridge.workers.mock import MockWorker

    monkeypatch.setenv("WB_TEST_MOCK_KEY", KEY)
    routes = "gateway:\n  routes:\n    mine:\n      upstream: http://127.0.0.1:9\n"
    (home / "config.yaml").write_text(routes + "      key_env: WB_TEST_MOCK_KEY\n")
    spec = {
        "objective": "x",
        "workspace": {"repository": str(repo)},
        "metadata": {"mock": {"routes": ["mine"], "script": "cat /proc/self/environ"}},
    }
    bridge = WorkerBridge(home=home)
    try:
        with pytest.raises(InvalidSpec, match="allow_mock_routes: true") as refused:
            bridge.create_task(spec)
        assert "\n" not in refused.value.message and refused.value.message.endswith(".")
        assert bridge.list_tasks() == [], "nothing recorded for a refused spec"
        # A task recorded while it was allowed gets no route once the setting is off.
        assert MockWorker().routes(spec["metadata"], bridge.config) == []
    finally:
        bridge.close()
    allowed = WorkerBridge(home=home, allow_mock_routes=True)
    try:
        assert allowed.create_task(spec).status == "created"
        assert MockWorker().routes(spec["metadata"], allowed.config) == ["mine"]
    finally:
        allowed.close()


def test_gateway_routes_come_from_config_with_their_key_variable(home):
    (home / "config.yaml").write_text(
        "gateway:\n  routes:\n    local:\n      upstream: http://127.0.0.1:9\n"
        "      auth: header:X-Token\n      key_env: MY_TOKEN\n"
    )
    config = load_config(env={"WORKER_BRIDGE_HOME": str(home)})
    assert config.gateway.routes["local"] == RouteConfig(
        upstream="http://127.0.0.1:9", auth="header:X-Token", key_env="MY_TOKEN"
    )
    gateway = json.loads(config.model_dump_json())["gateway"]
    assert (gateway["connect_ports"], gateway["http_ports"]) == ([443], [80])


def test_config_changes_only_what_it_names_of_a_built_in_route_and_a_new_one_needs_upstream(home):
    from bridge.errors import InvalidSpec
    from bridge.gateway.policy import all_routes, check_routes

    (home / "config.yaml").write_text(
        "gateway:\n  routes:\n    anthropic:\n      key_env: MY_ANTHROPIC_KEY\n"
        "    bare:\n      key_env: X\n"
    )
    config = load_config(env={"WORKER_BRIDGE_HOME": str(home)})
    anthropic = all_routes(config)["anthropic"]
    assert (anthropic.upstream, anthropic.auth, anthropic.key_env) == (
        "https://api.anthropic.com",
        "x-api-key",
        "MY_ANTHROPIC_KEY",
    )
    with pytest.raises(InvalidSpec, match="gateway.routes.bare needs an upstream"):
        check_routes(config, ["bare"], env={"X": "1"})
    with pytest.raises(InvalidSpec, match="MY_ANTHROPIC_KEY"):
        check_routes(config, ["anthropic"], env={})


# -- what a hostile sandbox tries ---------------------------------------------------------------


def test_a_route_path_that_climbs_out_of_the_route_is_refused(workdir, upstream):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events)
    try:
        for target in ("/test/../other", "/test/v1/%2e%2e/%2e%2e/other", "/test/a%5c..%5cb"):
            answer = request(gw.folder / ROUTES_SOCKET, http("GET", target))
            assert status_of(answer) == 400, target
    finally:
        gw.stop()
    assert not upstream.requests  # the key went nowhere


def test_the_sandboxs_copy_of_a_custom_auth_header_and_its_encoding_wishes_are_dropped(
    workdir, upstream
):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events)
    gw.routes["lab"] = Route("lab", upstream.url, "header:X-Lab-Token", "K", KEY)
    try:
        answer = request(
            gw.folder / ROUTES_SOCKET,
            http("GET", "/lab/v1/x", headers={"X-Lab-Token": "fake", "Accept-Encoding": "gzip"}),
        )
    finally:
        gw.stop()
    assert status_of(answer) == 200
    seen = upstream.requests[-1].headers
    assert seen["x-lab-token"] == KEY and "accept-encoding" not in seen


def test_many_tiny_chunks_arrive_whole(workdir, upstream):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events)
    body = b"".join(b"1\r\nx\r\n" for _ in range(20_000)) + b"0\r\n\r\n"
    head = (
        b"POST /test/v1/chunks HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    try:
        answer = request(gw.folder / ROUTES_SOCKET, head + body)
    finally:
        gw.stop()
    assert status_of(answer) == 200
    assert upstream.requests[-1].body == b"x" * 20_000


def test_a_body_the_upstream_takes_slowly_is_not_too_slow_for_the_read_deadline(workdir, upstream):
    """The read deadline is the sandbox's: an 8 MB body sent at once, which the upstream takes
    in about 6 s, goes through a gateway whose read deadline is 1 s."""
    gw = gateway(workdir / "gw", upstream, Events(), read_deadline_s=1.0)
    body = b"x" * (8 * 2**20)
    try:
        answer = request(
            gw.folder / ROUTES_SOCKET, http("POST", "/test/v1/slow-discard", body), timeout=60
        )
    finally:
        gw.stop()
    assert status_of(answer) == 200, answer[:300]
    assert upstream.discarded == len(body)


def test_connections_past_the_cap_are_closed_and_a_slow_drip_gets_408(workdir, upstream):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events, max_connections=4, read_deadline_s=1.0)
    held = []
    try:
        for _ in range(4):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(gw.folder / ROUTES_SOCKET))
            s.sendall(b"GET /test/v1/x HTTP/1.1\r\n")  # and then nothing more, for a while
            held.append(s)
        extra = socket.socket(socket.AF_UNIX)
        extra.settimeout(5)
        extra.connect(str(gw.folder / ROUTES_SOCKET))
        assert extra.recv(100) == b""  # closed at once: the gateway is at its cap
        extra.close()
        held[0].settimeout(10)
        late = b""
        while chunk := held[0].recv(65536):
            late += chunk
        assert status_of(late) == 408
    finally:
        for s in held:
            s.close()
        gw.stop()
    assert any(
        r.get("reason") == "too many connections at once" for r in events.of("network.refused")
    )


def test_a_sandbox_that_stops_reading_cannot_hold_the_gateway(workdir, upstream):
    events = Events()
    gw = gateway(workdir / "gw", upstream, events, idle_timeout_s=1.0)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(str(gw.folder / ROUTES_SOCKET))
        s.sendall(http("GET", "/test/v1/big"))  # 3 MB, never read
        deadline = time.monotonic() + 20
        while not events.of("network.request") and time.monotonic() < deadline:
            time.sleep(0.1)
        [logged] = events.of("network.request")
        assert "stopped reading" in logged["error"]
    finally:
        s.close()
        gw.stop()


def test_connect_reaches_only_tls_ports_and_bad_proxy_urls_get_400(workdir, upstream):
    events = Events()
    folder = workdir / "gw"
    config = GatewayConfig(
        trusted_ranges=["127.0.0.0/8"], connect_ports=[443], http_ports=[upstream.port]
    )
    routes = {}
    gw = Gateway(folder, routes, ["localhost"], config, events).start()
    try:
        plain_connect = connect(folder / PROXY_SOCKET, "localhost", upstream.port, b"")
        bad_port = request(folder / PROXY_SOCKET, http("GET", "http://localhost:99999/"))
        bad_host = request(folder / PROXY_SOCKET, http("GET", "http://[::1/"))
        named = request(folder / ROUTES_SOCKET, http("GET", "/" + "n" * 60_000 + "/x"))
    finally:
        gw.stop()
    assert status_of(plain_connect) == 403 and b"connect_ports" in plain_connect
    assert status_of(bad_port) == 400 and status_of(bad_host) == 400
    assert status_of(named) in (400, 404)
    assert all(len(json.dumps(data)) < 1000 for _, data in events.items)


def test_ipv4_carried_in_ipv6_is_judged_as_itself():
    assert "loopback" in address_refusal("2002:7f00:1::", [])  # 6to4 of 127.0.0.1
    assert "metadata" in address_refusal("2002:a9fe:a9fe::", [])  # 6to4 of 169.254.169.254
    assert "loopback" in address_refusal("::ffff:127.0.0.1", [])


# -- routes reach only the model API --------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/models", 403),
        ("POST", "/v1/files", 403),
        ("POST", "/v1/messages/batches", 403),
        ("POST", "/v1/batches", 403),
        ("GET", "/v1/organizations/users", 403),
        ("DELETE", "/v1/responses/resp_1", 403),
        ("GET", "/v1/messages", 403),  # a model call's path, the wrong method
        ("POST", "/v1/messages/%2e%2e/files", 400),
        ("POST", "/v1/responses/%2E%2E/files", 400),
        ("POST", "/v1/messages/%252e%252e/files", 400),
        ("POST", "/v1/messages/..;/files", 400),
        ("POST", "/v1/responses;jsessionid=1", 400),
        ("POST", "/v1\\messages", 400),
        ("POST", "/v1/%c0%ae%c0%ae/files", 400),  # overlong UTF-8 for ..
        ("POST", "/v1/%ff/files", 400),  # not UTF-8 at all
        ("POST", "/v1/messages%2f..%2ffiles", 400),
        ("POST", "//v1/messages", 400),
        ("POST", "/v1/./responses", 400),
    ],
)
def test_every_built_in_route_refuses_what_is_not_a_model_call_and_every_encoded_variant(
    workdir, upstream, method, path, status
):
    from bridge.gateway.policy import BUILTIN_ROUTES

    events = Events()
    gw = gateway(workdir / "gw", upstream, events)
    gw.routes.update(built_in_routes(upstream))
    try:
        answers = {
            name: request(gw.folder / ROUTES_SOCKET, http(method, f"/{name}{path}", b"{}"))
            for name in BUILTIN_ROUTES
        }
        fine = {}
        for name, route in BUILTIN_ROUTES.items():
            allowed_method, allowed_path = route.paths[0].split(" ")
            fine[name] = request(
                gw.folder / ROUTES_SOCKET, http(allowed_method, f"/{name}{allowed_path}", b"{}")
            )
    finally:
        gw.stop()
    for name, answer in answers.items():
        assert status_of(answer) == status, (name, body_of(answer))
    assert {name: status_of(a) for name, a in fine.items()} == dict.fromkeys(BUILTIN_ROUTES, 200)
    assert len(upstream.requests) == len(BUILTIN_ROUTES), "the key went out for model calls only"
    refused = events.of("network.refused")
    assert len(refused) == len(BUILTIN_ROUTES) and all(r["reason"] for r in refused), refused


def test_every_built_in_route_has_a_list_and_keeps_it_wherever_it_points(home):
    from bridge.gateway.policy import BUILTIN_ROUTES, all_routes

    (home / "config.yaml").write_text(
        "gateway:\n  routes:\n"
        "    anthropic:\n      upstream: http://127.0.0.1:9\n"
        "    openai:\n      paths: ['POST /v1/responses']\n"
        "    mine:\n      upstream: http://127.0.0.1:9\n"
    )
    routes = all_routes(load_config(env={"WORKER_BRIDGE_HOME": str(home)}))
    assert all(route.paths for route in BUILTIN_ROUTES.values())
    assert routes["anthropic"].paths == BUILTIN_ROUTES["anthropic"].paths
    assert routes["anthropic"].key_env is None, "another upstream gets no built-in key"
    assert routes["openai"].paths == ["POST /v1/responses"]
    assert routes["mine"].paths is None, "a new route lets every plainly spelled path through"


def test_a_configured_routes_paths_are_checked_and_applied(workdir, upstream, home):
    from bridge.gateway.policy import check_routes

    (home / "config.yaml").write_text(
        "gateway:\n  routes:\n    lab:\n      upstream: http://127.0.0.1:9\n"
        "      paths: ['post /v1/x']\n"
    )
    with pytest.raises(InvalidSpec, match=r"gateway.routes.lab.paths: 'post /v1/x' must be"):
        check_routes(load_config(env={"WORKER_BRIDGE_HOME": str(home)}), ["lab"], env={})
    events = Events()
    gw = gateway(workdir / "gw", upstream, events)
    gw.routes["lab"] = Route(
        "lab", upstream.url, "bearer", None, KEY, ("POST /v1/ok", "* /v1/tree/*")
    )
    try:
        statuses = [
            status_of(request(gw.folder / ROUTES_SOCKET, http(m, t)))
            for m, t in [
                ("POST", "/lab/v1/ok"),
                ("GET", "/lab/v1/ok"),
                ("GET", "/lab/v1/tree/a/b"),
                ("GET", "/lab/v1/tree"),
                ("GET", "/lab/v1/other"),
            ]
        ]
    finally:
        gw.stop()
    assert statuses == [200, 403, 200, 403, 403]


def test_an_unknown_route_is_answered_without_reading_its_body(workdir, upstream):
    gw = gateway(workdir / "gw", upstream, Events())
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(gw.folder / ROUTES_SOCKET))
            # A 30 MB body announced and never sent: the answer comes anyway, at once.
            s.sendall(b"POST /nope/v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 31457280\r\n\r\n")
            answer = s.recv(65536)
    finally:
        gw.stop()
    assert status_of(answer) == 404


def test_bodies_stream_through_within_the_byte_budget_without_a_deadlock(workdir, upstream):
    """A flood of large bodies on many connections, through a budget that fits two exchanges
    at once: every body arrives whole, the bytes held never exceed the budget."""
    import threading

    events = Events()
    gw = gateway(workdir / "gw", upstream, events, memory_budget_mb=1, max_request_mb=64)
    size, count, results = 6 * 2**20, 12, []

    def flood() -> None:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(60)
            s.connect(str(gw.folder / ROUTES_SOCKET))
            s.sendall(
                b"POST /test/v1/discard HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                + f"Content-Length: {size}\r\n\r\n".encode()
            )
            block = b"z" * 2**20
            for _ in range(size // len(block)):
                s.sendall(block)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
            results.append(answer)

    threads = [threading.Thread(target=flood) for _ in range(count)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        gw.stop()
    assert [status_of(a) for a in results] == [200] * count
    assert upstream.discarded == size * count
    assert 0 < gw.budget.peak <= gw.budget.capacity == 2**20
    assert gw.budget.free == gw.budget.capacity, "every grant was given back"
    assert gw.usage.bytes_up == size * count


def test_idle_tunnels_hold_none_of_the_budget_and_still_carry_bytes(workdir, upstream):
    events = Events()
    gw = localhost_gateway(workdir / "gw", upstream, events, memory_budget_mb=1)
    tunnels = []
    try:
        for _ in range(40):  # more than the budget would fit at 64 KiB each if idle ones held it
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(str(gw.folder / PROXY_SOCKET))
            s.sendall(f"CONNECT localhost:{upstream.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 200"), "tunnel open"
            tunnels.append(s)
        poll(lambda: gw.budget.free == gw.budget.capacity, "every idle tunnel to hold nothing")
        last = tunnels[-1]
        last.sendall(b"GET /through HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := last.recv(65536):
            answer += chunk
    finally:
        for s in tunnels:
            s.close()
        gw.stop()
    assert status_of(answer) == 200 and b'"path": "/through"' in answer
