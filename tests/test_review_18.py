"""Hostile review of the `lead` branch's scope, image, gateway and mock-route bounds: each test
plays a malicious worker (code in the sandbox, reaching only its gateway's sockets) or a
malicious MCP client (a token holder of a server scoped to one folder). The review's five
findings (a devcontainer build from any image, JSON answers held outside the byte budget,
max_events per gateway rather than per task, owner permissions not reaching existing tasks,
idempotency keys across scopes) are fixed and their tests pass; the others are attacks that
held. Memory is measured from outside, on a process hosting only a
gateway (tests/support/gateway_host.py)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from urllib.parse import unquote

import pytest
from support.gateway_host import GatewayHost
from support.gateway_sockets import Events, built_in_routes, gateway, http, request, status_of
from support.hostile_upstream import HostileUpstream
from support.repos import commit_all, make_repo
from support.tasks import bare_spec, mock_task

from bridge import WorkerBridge
from bridge.config.settings import load_config
from bridge.errors import InvalidSpec, TaskNotFound
from bridge.gateway.server import ROUTES_SOCKET
from bridge.sandbox.fake import FakeSandbox
from bridge.scope import image_allowed

BUDGET_MB = 48  # gateway.memory_budget_mb's default
SLACK_MB = 16  # the interpreter, aiohttp's pools, the sockets: what the existing flood shows


@pytest.fixture
def hostile():
    server = HostileUpstream().start()
    yield server
    server.stop()


def _bridge(home: Path, **overrides) -> WorkerBridge:
    return WorkerBridge(home=home, sandbox=FakeSandbox(), **overrides)


def _allowed_and_outside(workdir: Path) -> tuple[Path, Path]:
    """The one folder a scoped bridge will allow, and a repository outside it."""
    allowed = workdir / "allowed"
    allowed.mkdir()
    return allowed, make_repo(workdir, "outside")


# -- 1. repositories bound every verb ------------------------------------------------------------


def test_a_folder_whose_name_extends_an_allowed_one_is_outside_with_or_without_a_slash(
    workdir, home
):
    allowed = workdir / "repos"
    allowed.mkdir()
    evil = make_repo(workdir, "repos-evil")  # a string prefix match would let it in
    unscoped = _bridge(home, repositories=[])
    task = unscoped.create_task(bare_spec(evil)).task_id
    unscoped.close()
    for spelled in (str(allowed), str(allowed) + "/", str(allowed) + "/."):
        scoped = _bridge(home, repositories=[Path(spelled)])
        try:
            with pytest.raises(InvalidSpec, match="outside the folders"):
                scoped.create_task(bare_spec(evil))
            with pytest.raises(TaskNotFound):
                scoped.get_task(task)
            assert scoped.list_tasks() == []
        finally:
            scoped.close()


def test_a_link_or_a_climb_inside_the_allowed_folder_does_not_reach_a_repository_outside(
    workdir, home
):
    allowed, outside = _allowed_and_outside(workdir)
    (allowed / "link").symlink_to(outside)
    scoped = _bridge(home, repositories=[allowed])
    try:
        for spelled in (allowed / "link", Path(f"{allowed}/../outside")):
            with pytest.raises(InvalidSpec, match="outside the folders"):
                scoped.create_task(bare_spec(spelled))
    finally:
        scoped.close()


def test_a_task_whose_repository_was_swapped_for_a_link_outside_is_absent(workdir, home):
    allowed, outside = _allowed_and_outside(workdir)
    mine = make_repo(allowed, "mine")
    scoped = _bridge(home, repositories=[allowed])
    try:
        task = scoped.create_task(bare_spec(mine)).task_id
        os.rename(mine, workdir / "parked")
        mine.symlink_to(outside)
        with pytest.raises(TaskNotFound):
            scoped.get_task(task)
        with pytest.raises(TaskNotFound):
            scoped.cancel_task(task)
        assert scoped.list_tasks() == []
    finally:
        scoped.close()


def test_an_idempotency_key_used_only_in_another_repository_answers_as_an_unused_key(workdir, home):
    allowed, outside = _allowed_and_outside(workdir)
    mine = make_repo(allowed, "mine")
    unscoped = _bridge(home, repositories=[])
    unscoped.create_task(bare_spec(outside, idempotency_key="JIRA-4711-fix-billing"))
    unscoped.close()
    scoped = _bridge(home, repositories=[allowed])
    try:
        fresh = scoped.create_task(bare_spec(mine, idempotency_key="never-used"))
        assert fresh.status == "created"
        # The oracle: a client probing keys learns which another tenant used (and cannot use
        # them itself) unless this answers like the unused key above.
        probed = scoped.create_task(bare_spec(mine, idempotency_key="JIRA-4711-fix-billing"))
        assert probed.status == "created"
    finally:
        scoped.close()


# -- 2. images a spec may name -------------------------------------------------------------------


def test_an_image_spelled_another_way_than_an_allowed_pattern_is_refused(home, docker_images):
    import docker

    config = load_config({"WORKER_BRIDGE_HOME": str(home)}).model_copy(
        update={"allowed_images": ["python:*"]}
    )
    mock = docker_images.image_for("mock")
    client = docker.from_env()
    secret = f"wb-review-secret:{secrets.token_hex(4)}"
    client.images.get(mock).tag(secret)
    try:
        image_id = client.images.get(secret).id  # sha256:...
        refused = [
            secret,
            f"docker.io/library/{secret}",
            image_id,
            image_id.removeprefix("sha256:"),
            image_id.removeprefix("sha256:")[:12],
            f"docker.io/{mock}",
            mock.upper(),
            f"{mock}@{image_id}",
        ]
        assert not [ref for ref in refused if image_allowed(config, ref)]
        assert image_allowed(config, mock) and image_allowed(config, "python:3.12")
        # An allowed name carrying the secret image's id as its digest: the engine does not
        # resolve it to the secret image (it looks the digest up under that name only).
        for ref in (f"python:3.12@{image_id}", f"{mock}@{image_id}"):
            with pytest.raises(docker.errors.ImageNotFound):
                client.images.get(ref)
    finally:
        client.images.remove(secret)
        client.close()


@pytest.mark.parametrize(
    ("dockerfile", "args"),
    [
        ("FROM wb-review-secret:1\nRUN cat /secret.txt\n", {}),
        ("ARG BASE=wb-review-secret:1\nFROM ${BASE}\n", {}),
        ("ARG BASE\nFROM ${BASE}\n", {"BASE": "wb-review-secret:1"}),
        ("FROM worker-bridge/verify:0.1.0\nCOPY --from=wb-review-secret:1 /secret.txt /\n", {}),
    ],
    ids=["from", "arg-default", "build-arg", "copy-from"],
)
def test_a_devcontainer_build_from_an_image_not_allowed_is_refused_at_creation(
    workdir, home, repo, dockerfile, args
):
    (repo / ".devcontainer").mkdir()
    build = {"dockerfile": "Dockerfile", **({"args": args} if args else {})}
    (repo / ".devcontainer" / "devcontainer.json").write_text(json.dumps({"build": build}))
    (repo / ".devcontainer" / "Dockerfile").write_text(dockerfile)
    commit_all(repo, "a devcontainer built from another image")
    bridge = _bridge(home)
    try:
        with pytest.raises(InvalidSpec, match="allowed_images"):
            bridge.create_task(
                bare_spec(
                    repo, environment={"devcontainer": True}, verification={"commands": ["true"]}
                )
            )
    finally:
        bridge.close()


# -- 3. the gateway --------------------------------------------------------------------------


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


# -- 4. metadata.mock.routes ------------------------------------------------------------------


def test_a_follow_up_on_a_mock_task_made_while_routes_were_allowed_is_refused_once_they_are_not(
    workdir, home, repo, upstream, docker_images
):
    routes = f"gateway:\n  routes:\n    test:\n      upstream: {upstream.url}\n"
    (home / "config.yaml").write_text("allow_mock_routes: true\n" + routes)
    probe = "env | grep '^WB_ROUTE_' | cut -d= -f1; echo routes-probed"
    mock = {"routes": ["test"], "write": {"a.txt": "a\n"}, "on_follow_up": {"script": probe}}
    allowing = WorkerBridge(home=home)
    try:
        task = allowing.create_task(mock_task(repo, mock, verify=["true"])).task_id
        assert allowing.run_task(task).status == "succeeded"
    finally:
        allowing.close()
    (home / "config.yaml").write_text(routes)  # the owner turns mock routes off
    bridge = WorkerBridge(home=home)
    try:
        with pytest.raises(InvalidSpec, match="allow_mock_routes"):
            bridge.follow_up(task, "again")
        assert bridge.get_task(task).status == "succeeded", "no turn was queued"
    finally:
        bridge.close()


def test_a_follow_up_on_a_task_whose_image_is_no_longer_allowed_is_refused(
    workdir, home, repo, docker_images
):
    import docker

    client = docker.from_env()
    image = f"wb-review-env:{secrets.token_hex(4)}"
    client.images.get(docker_images.image_for("mock")).tag(image)
    try:
        (home / "config.yaml").write_text(f"allowed_images: ['{image}']\n")
        spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["true"])
        spec["environment"] = {"image": image}
        allowing = WorkerBridge(home=home)
        try:
            task = allowing.create_task(spec).task_id
            assert allowing.run_task(task).status == "succeeded"
        finally:
            allowing.close()
        (home / "config.yaml").write_text("allowed_images: []\n")  # the owner narrows it
        bridge = WorkerBridge(home=home)
        try:
            with pytest.raises(InvalidSpec, match="allowed_images"):
                bridge.follow_up(task, "again")
            with pytest.raises(InvalidSpec, match="allowed_images"):
                bridge.accept_task(task)
        finally:
            bridge.close()
    finally:
        client.images.remove(image)
        client.close()


# -- 5. the summary after a lost log stream ------------------------------------------------------


def test_the_kept_log_read_after_a_lost_stream_still_refuses_a_session_id_of_the_wrong_shape(
    home, repo, monkeypatch
):
    from bridge.sandbox.fake import Scripted
    from bridge.sandbox.spec import ContainerSpec

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    good = "0f1e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b"
    lines = [json.dumps({"type": "system", "subtype": "init", "session_id": good})]
    lines += [
        json.dumps({"type": "assistant", "message": {"content": [{"type": "text", "text": t}]}})
        for t in (f"step {i}" for i in range(50))
    ]
    for forged in ("--dangerously-skip-permissions", "x; touch /tmp/pwned", "../../etc"):
        lines.append(json.dumps({"type": "system", "session_id": forged}))
    lines.append('{"type": "result", "result": "done", "session_id": "--help"}')

    def behaviour(spec: ContainerSpec) -> Scripted | None:
        if spec.labels["io.worker-bridge.role"] != "worker":
            return None
        return Scripted(output=lines, stream_ends_after=5)

    bridge = WorkerBridge(home=home, sandbox=FakeSandbox(behaviour))
    try:
        spec = {**bare_spec(repo), "worker": "claude-code", "verification": {"commands": []}}
        result = bridge.run_task(bridge.create_task(spec).task_id)
        record = bridge.store.load_task(result.task_id)
        notes = [
            e.data["text"]
            for e in bridge.task_logs(result.task_id, limit=1000).events
            if e.kind == "worker.progress"
        ]
    finally:
        bridge.close()
    assert any("live output ended early" in n for n in notes), "the stream did end early"
    assert result.summary == "done"
    assert record.session_id == good, "no forged session id reaches the next command line"
