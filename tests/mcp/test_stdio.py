"""The MCP server as an MCP client sees it: `worker-bridge-mcp` started as a subprocess and driven
through a real SDK client session over stdio (the `mcp` package's `Client`).

Covered: the tool listing (names, input schemas with descriptions and defaults), the delegate ->
poll -> accept / follow-up flow, paging the event log, cancelling a running task, tool errors
that leave the server healthy (also with no Docker engine), a server that keeps answering while
two `wait=true` delegations are in flight, stdout carrying protocol only, and the host
concurrency limit holding across three server processes sharing one state root.

Every wait is bounded (`anyio.fail_after` or a deadline); polling intervals are short."""

from __future__ import annotations

import json
import os
import select
import subprocess
import threading
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from support.cli import MCP_SERVER
from support.engine import EngineSampler, task_containers
from support.mcp_session import (
    MCP_TOOLS,
    POLL_S,
    call,
    call_error,
    delegate,
    mcp_server,
    server_env,
    wait_event,
    wait_status,
)
from support.repos import git, make_repo
from support.tasks import TERMINAL

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_task_outlives_the_test")]


# -- helpers -----------------------------------------------------------------------------------


async def assert_healthy(client: Client) -> None:
    listing = await call(client, "list_workers")
    assert "mock" in {w["name"] for w in listing["workers"]}, listing


async def read_all_events(client: Client, task_id: str) -> list[dict[str, Any]]:
    page = await call(client, "worker_logs", {"task_id": task_id, "limit": 1000})
    assert page["has_more"] is False
    return page["events"]


def paths(result: dict[str, Any]) -> dict[str, str]:
    return {c["path"]: c["change"] for c in result["changed_files"]}


# -- the tool listing --------------------------------------------------------------------------


async def test_every_tool_says_what_it_does_to_the_world(home):
    async with mcp_server(home) as client:
        listing = await client.list_tools()
    hints = {tool.name: tool.annotations for tool in listing.tools}
    assert set(hints) == MCP_TOOLS and all(h is not None for h in hints.values())
    for name in ("worker_status", "worker_logs", "list_workers"):
        assert hints[name].read_only_hint is True and hints[name].destructive_hint is False, name
    for name in ("worker_prune", "worker_cancel", "worker_accept"):
        assert hints[name].destructive_hint is True and hints[name].read_only_hint is False, name
        assert hints[name].idempotent_hint is True, name
    for name in ("worker_delegate", "worker_follow_up"):
        hint = hints[name]
        assert hint.read_only_hint is False and hint.idempotent_hint is False, name
        assert hint.open_world_hint is True, "the worker reaches its model provider"
    assert all(h.title for h in hints.values())


async def test_all_eight_tools_are_listed_with_described_parameters_and_their_defaults(home):
    async with mcp_server(home) as client:
        listing = await client.list_tools()
        instructions = client.instructions

    tools = {tool.name: tool for tool in listing.tools}
    assert set(tools) == MCP_TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 80, (tool.name, tool.description)
        schema = tool.input_schema
        assert schema["type"] == "object", tool.name
        for param, prop in schema.get("properties", {}).items():
            assert len(prop.get("description", "").strip()) > 10, (tool.name, param)

    delegate_ = tools["worker_delegate"]
    props = delegate_.input_schema["properties"]
    assert set(delegate_.input_schema["required"]) == {"objective", "repository"}
    assert {
        "objective",
        "repository",
        "worker",
        "permission",
        "verify",
        "base_ref",
        "wait",
        "type",
        "metadata",
    } <= set(props)
    assert props["wait"]["default"] is False
    assert props["worker"]["default"] == "mock"
    assert props["permission"]["default"] == "workspace_write"
    assert set(props["permission"]["enum"]) == {"read_only", "workspace_write", "full_access"}
    assert props["base_ref"]["default"] == "HEAD"
    assert "worker_status" in delegate_.description and "poll" in delegate_.description.lower()

    assert "task_id" not in tools["worker_status"].input_schema.get("required", [])
    for tool in tools.values():  # the docstring's indentation stays in the source
        lines = tool.description.splitlines()
        assert not any(line.startswith(" ") for line in lines), (tool.name, tool.description)
        assert tool.description == tool.description.strip()
    logs = tools["worker_logs"].input_schema
    assert logs["required"] == ["task_id"]
    assert logs["properties"]["after"]["default"] == 0
    prune = tools["worker_prune"].input_schema["properties"]
    assert prune["apply"]["default"] is False
    assert prune["include_unaccepted"]["default"] is False
    follow = tools["worker_follow_up"].input_schema
    assert set(follow["required"]) == {"task_id", "message"}
    assert follow["properties"]["wait"]["default"] is False
    assert set(tools["worker_cancel"].input_schema["required"]) == {"task_id"}
    assert set(tools["worker_accept"].input_schema["required"]) == {"task_id"}

    assert instructions and "worker_delegate" in instructions and "worker_accept" in instructions


# -- the task flow -----------------------------------------------------------------------------


async def test_a_delegated_task_is_polled_to_success_with_verification_and_a_diff(
    home, repo, docker_images
):
    mock = {"write": {"hello.txt": "hello from the worker\n", "README.md": "# demo, changed\n"}}
    async with mcp_server(home) as client:
        with anyio.fail_after(5):
            queued = await delegate(client, repo, mock, verify=["grep -q worker hello.txt"])
        assert queued["status"] == "queued", queued
        task_id = queued["task_id"]
        result = await wait_status(client, task_id)

    assert result["status"] == "succeeded", result["error"]
    assert result["task_id"] == task_id and result["worker"] == "mock"
    assert result["error"] is None
    assert result["verification"]["ok"] is True
    assert [c["exit_code"] for c in result["verification"]["commands"]] == [0]
    assert paths(result) == {"hello.txt": "added", "README.md": "modified"}

    diff_path = Path(result["artifacts"]["diff"])
    assert diff_path.is_absolute() and diff_path.is_file(), diff_path
    diff = diff_path.read_text()
    assert "+hello from the worker" in diff
    assert "-# demo" in diff and "+# demo, changed" in diff
    assert "hello.txt" in diff
    # nothing reaches the user's working tree before worker_accept
    assert not (repo / "hello.txt").exists()
    assert (repo / "README.md").read_text() == "# demo\n"


async def test_paging_the_event_log_returns_every_event_once_in_order(home, repo, docker_images):
    mock = {"script": "for i in $(seq 1 12); do echo progress line $i; done"}
    async with mcp_server(home) as client:
        task_id = (await delegate(client, repo, mock, verify=["true"]))["task_id"]
        assert (await wait_status(client, task_id))["status"] == "succeeded"

        full = await read_all_events(client, task_id)
        pages: list[list[dict]] = []
        after = 0
        with anyio.fail_after(30):
            while True:
                page = await call(
                    client, "worker_logs", {"task_id": task_id, "after": after, "limit": 3}
                )
                assert len(page["events"]) <= 3
                pages.append(page["events"])
                if page["events"]:
                    assert page["next_after"] == page["events"][-1]["event_id"]
                after = page["next_after"]
                if not page["has_more"]:
                    break
        # past the end: nothing, no more, and the cursor stays put
        tail = await call(client, "worker_logs", {"task_id": task_id, "after": after, "limit": 3})

    ids = [e["event_id"] for e in full]
    assert len(full) > 9, f"expected a dozen progress lines and more, got {len(full)} events"
    assert ids == sorted(set(ids)), "event ids strictly increase"
    assert sum(1 for e in full if e["kind"] == "worker.progress") >= 12
    assert all(len(p) == 3 for p in pages[:-1]), [len(p) for p in pages]
    paged = [e for p in pages for e in p]
    assert [e["event_id"] for e in paged] == ids, "paging drops or repeats nothing"
    assert paged == full
    assert tail == {"events": [], "next_after": after, "has_more": False}
    assert after == ids[-1]


async def test_cancelling_a_running_task_ends_it_and_removes_its_container(
    home, repo, docker_images
):
    async with mcp_server(home) as client:
        task_id = (await delegate(client, repo, {"sleep": 30}))["task_id"]
        await wait_event(client, task_id, "worker.started")
        assert task_containers(task_id), "the worker container runs before the cancel"

        with anyio.fail_after(20):
            cancelled = await call(client, "worker_cancel", {"task_id": task_id})
        assert cancelled["status"] == "cancelled", cancelled
        assert cancelled["error"]["kind"] == "cancelled"
        assert task_containers(task_id) == [], "no container of the task remains"

        again = await call(client, "worker_status", {"task_id": task_id})
        assert again["status"] == "cancelled"
        kinds = [e["kind"] for e in await read_all_events(client, task_id)]
        assert "task.cancelled" in kinds
        # cancelling a finished task is not an error and changes nothing
        assert (await call(client, "worker_cancel", {"task_id": task_id}))["status"] == "cancelled"
    assert task_containers(task_id) == []


async def test_a_waiting_delegation_returns_cancelled_when_the_task_is_cancelled_meanwhile(
    home, repo, docker_images
):
    outcome: dict[str, dict] = {}
    async with mcp_server(home) as client:

        async def delegate_and_wait() -> None:
            outcome["result"] = await delegate(client, repo, {"sleep": 30}, wait=True)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(delegate_and_wait)
                while True:
                    tasks = (await call(client, "worker_status"))["tasks"]
                    if tasks and tasks[0]["status"] == "running":
                        break
                    await anyio.sleep(POLL_S)
                task_id = tasks[0]["task_id"]
                await wait_event(client, task_id, "worker.started")
                cancelled = await call(client, "worker_cancel", {"task_id": task_id})

    assert cancelled["status"] == "cancelled"
    assert outcome["result"]["task_id"] == task_id
    assert outcome["result"]["status"] == "cancelled", outcome["result"]
    assert task_containers(task_id) == []


async def test_accepting_writes_the_change_into_the_working_tree_once(home, repo, docker_images):
    head = git(repo, "rev-parse", "HEAD").strip()
    async with mcp_server(home) as client:
        mock = {"write": {"notes.txt": "accepted notes\n"}}
        task_id = (await delegate(client, repo, mock, verify=["test -f notes.txt"]))["task_id"]
        assert (await wait_status(client, task_id))["status"] == "succeeded"

        accepted = await call(client, "worker_accept", {"task_id": task_id})
        assert accepted["accepted"] is True, accepted
        assert accepted["applied"] == ["notes.txt"]
        assert accepted.get("reason") is None
        assert (repo / "notes.txt").read_text() == "accepted notes\n"
        assert git(repo, "rev-parse", "HEAD").strip() == head, "accept commits nothing"
        assert "?? notes.txt" in git(repo, "status", "--porcelain")
        assert (await call(client, "worker_status", {"task_id": task_id}))["status"] == "accepted"

        again = await call_error(client, "worker_accept", {"task_id": task_id})
        assert f"Task {task_id} is accepted" in again and "(refused: status)" in again, again
        await assert_healthy(client)


async def test_each_tool_declares_the_typed_record_it_returns(home):
    # The SDK's client checks every result against these (tests/support/mcp_session.py's
    # call, which also holds the text to a few lines for the model, not the document again).
    async with mcp_server(home) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    shapes = {
        "worker_delegate": {"task_id", "status", "changed_files", "verification", "requests"},
        "worker_cancel": {"task_id", "status"},
        "worker_follow_up": {"task_id", "status"},
        "worker_answer": {"task_id", "requests"},
        "worker_accept": {"accepted", "applied", "head"},
        "worker_logs": {"events", "next_after", "has_more"},
        "list_workers": {"workers"},
        "worker_prune": {"applied", "actions"},
        "worker_compete": {"job_id", "tasks", "candidates", "winner"},
        "worker_review": {"job_id", "rounds"},
        "worker_job_status": {"job_id", "status"},
        "worker_job_accept": {"accepted", "applied"},
        "worker_job_cancel": {"job_id", "status"},
    }
    for name, fields in shapes.items():
        schema = tools[name].output_schema
        assert schema and schema["type"] == "object", name
        assert fields <= set(schema["properties"]), (name, sorted(schema["properties"]))
    # One task, or the recent ones: two shapes, so no single schema (structured all the same).
    assert tools["worker_status"].output_schema is None


async def test_a_refused_accept_is_a_tool_error_that_names_the_argument_to_use(
    home, repo, docker_images
):
    async with mcp_server(home) as client:
        mock = {"write": {"unchecked.txt": "u\n"}}
        task_id = (await delegate(client, repo, mock))["task_id"]  # no verify commands
        assert (await wait_status(client, task_id))["status"] == "succeeded"
        refused = await call_error(client, "worker_accept", {"task_id": task_id})
        assert not (repo / "unchecked.txt").exists(), "a refusal writes nothing"
        args = {"task_id": task_id, "allow_unverified": True}
        accepted = await call(client, "worker_accept", args)
    assert "allow_unverified=true" in refused and "(refused: unverified)" in refused, refused
    assert "--allow-unverified" not in refused
    assert accepted["accepted"] is True and accepted["applied"] == ["unchecked.txt"]


async def test_a_follow_up_turn_keeps_the_first_change_and_adds_the_second(
    home, repo, docker_images
):
    mock = {
        "write": {"first.txt": "one\n"},
        "on_follow_up": {"write": {"second.txt": "two\n"}},
    }
    async with mcp_server(home) as client:
        task_id = (await delegate(client, repo, mock, verify=["test -f first.txt"]))["task_id"]
        first = await wait_status(client, task_id)
        assert first["status"] == "succeeded", first["error"]
        assert paths(first) == {"first.txt": "added"}

        with anyio.fail_after(60):
            followed = await call(
                client,
                "worker_follow_up",
                {"task_id": task_id, "message": "Also add second.txt.", "wait": True},
            )
        kinds = [e["kind"] for e in await read_all_events(client, task_id)]

    assert followed["task_id"] == task_id
    assert followed["status"] == "succeeded", followed["error"]
    assert paths(followed) == {"first.txt": "added", "second.txt": "added"}
    assert followed["verification"]["ok"] is True
    diff = Path(followed["artifacts"]["diff"]).read_text()
    assert "+one" in diff and "+two" in diff
    assert "task.follow_up" in kinds
    assert kinds.count("worker.started") == 2, kinds


# -- errors ------------------------------------------------------------------------------------


async def test_bad_calls_are_tool_errors_and_the_server_answers_the_next_call(home, repo, workdir):
    async with mcp_server(home) as client:
        text = await call_error(client, "worker_status", {"task_id": "nope"})
        assert "nope" in text
        await assert_healthy(client)

        for tool, args in [
            ("worker_logs", {"task_id": "nope"}),
            ("worker_cancel", {"task_id": "nope"}),
            ("worker_accept", {"task_id": "nope"}),
            ("worker_follow_up", {"task_id": "nope", "message": "more"}),
        ]:
            assert "nope" in await call_error(client, tool, args), tool
            await assert_healthy(client)

        base = {"objective": "x", "metadata": {"mock": {"write": {"a": "b"}}}}
        text = await call_error(client, "worker_delegate", {**base, "repository": "repo"})
        assert "'repo'" in text and "relative" in text.lower(), text
        await assert_healthy(client)

        text = await call_error(
            client, "worker_delegate", {**base, "repository": str(repo), "worker": "no-such"}
        )
        assert "no-such" in text and "worker" in text.lower(), text
        await assert_healthy(client)

        missing = workdir / "missing"
        text = await call_error(client, "worker_delegate", {**base, "repository": str(missing)})
        assert str(missing) in text, text
        await assert_healthy(client)

        text = await call_error(
            client,
            "worker_delegate",
            {**base, "repository": str(repo), "permission": "root"},
        )
        assert "permission" in text, text
        await assert_healthy(client)

        text = await call_error(
            client,
            "worker_delegate",
            {**base, "repository": str(repo), "environment": {"devcontainer": True}},
        )
        assert ".devcontainer/devcontainer.json" in text, text
        await assert_healthy(client)

        # nothing was created by the refused delegations
        assert (await call(client, "worker_status"))["tasks"] == []


async def test_without_a_docker_engine_the_server_still_answers_and_says_how_to_start_it(
    home, repo
):
    def says_how_to_start(text: str) -> bool:
        lowered = text.lower()
        return "docker" in lowered and "start" in lowered

    env = {"DOCKER_HOST": "unix:///nonexistent.sock"}
    async with mcp_server(home, env) as client:
        with anyio.fail_after(20):
            result = await client.call_tool("list_workers", {})
        if result.is_error:
            assert says_how_to_start(result.content[0].text), result.content[0].text
        else:
            workers = result.structured_content["workers"]
            assert workers and all(w["installed"] is False for w in workers), workers
        await call(client, "worker_status")  # the next call works

        with anyio.fail_after(20):
            result = await client.call_tool(
                "worker_delegate",
                {
                    "objective": "x",
                    "repository": str(repo),
                    "metadata": {"mock": {"write": {"a.txt": "a"}}},
                },
            )
        if result.is_error:
            assert says_how_to_start(result.content[0].text), result.content[0].text
        else:
            failed = await wait_status(client, result.structured_content["task_id"])
            assert failed["status"] == "failed", failed
            assert failed["error"]["kind"] == "sandbox", failed["error"]
            assert says_how_to_start(failed["error"]["message"]), failed["error"]

        with anyio.fail_after(20):
            again = await call(client, "list_workers")
        assert again["workers"]


# -- the event loop stays free -----------------------------------------------------------------


async def test_the_server_answers_while_two_waiting_delegations_are_in_flight(
    home, repo, workdir, docker_images
):
    other = make_repo(workdir, "other")
    order: list[str] = []
    results: dict[str, dict] = {}

    async with mcp_server(home) as client:

        async def delegate_and_wait(name: str, where: Path) -> None:
            results[name] = await delegate(
                client,
                where,
                {"sleep": 3, "write": {f"{name}.txt": name}},
                verify=[f"test -f {name}.txt"],
                wait=True,
                objective=name,
            )
            order.append(name)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                group.start_soon(delegate_and_wait, "a", repo)
                group.start_soon(delegate_and_wait, "b", other)
                # both delegations are in the store (answered on the same session meanwhile)
                while len((await call(client, "worker_status"))["tasks"]) < 2:
                    await anyio.sleep(POLL_S)
                listing = await call(client, "worker_status")
                workers = await call(client, "list_workers")
                order.append("list_workers")

    assert workers["workers"]
    assert all(t["status"] not in TERMINAL for t in listing["tasks"]), listing
    assert order[0] == "list_workers", f"list_workers waited for a delegation: {order}"
    assert sorted(order[1:]) == ["a", "b"]
    for name, result in results.items():
        assert result["status"] == "succeeded", (name, result["error"])
        assert paths(result) == {f"{name}.txt": "added"}


# -- stdout and logs ---------------------------------------------------------------------------


class RawSession:
    """A server process spoken to by hand: one JSON-RPC request per line, every stdout line kept."""

    def __init__(self, home: Path) -> None:
        self.proc = subprocess.Popen(
            MCP_SERVER,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=server_env(home),
        )
        self.lines: list[bytes] = []
        self._buffer = b""
        self._next_id = 0
        self.stderr = b""
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        self.stderr = self.proc.stderr.read()

    def send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict | None = None, deadline_s: float = 20) -> dict:
        self._next_id += 1
        self.send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params or {}})
        deadline = time.monotonic() + deadline_s
        while True:
            for line in self.lines:
                message = json.loads(line)
                if message.get("id") == self._next_id:
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no answer to {method} within {deadline_s} s")
            self._read(remaining)

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.proc.stdout], [], [], min(timeout, 0.5))
        if not ready:
            return True
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        if not chunk:
            return False
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n")
        self.lines.extend(complete)
        return True

    def close(self, deadline_s: float = 15) -> int:
        self.proc.stdin.close()
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline and self._read(deadline - time.monotonic()):
            pass
        try:
            return self.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self._stderr_thread.join(timeout=10)


def test_stdout_carries_only_protocol_messages_and_the_log_goes_to_a_file(home):
    raw = RawSession(home)
    try:
        init = raw.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw-test", "version": "0"},
            },
        )
        assert init["result"]["serverInfo"]["name"] == "worker-bridge", init
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools = raw.request("tools/list")
        assert {t["name"] for t in tools["result"]["tools"]} == MCP_TOOLS
        failed = raw.request("tools/call", {"name": "worker_status", "arguments": {"task_id": "x"}})
        assert failed["result"]["isError"] is True, failed
        ok = raw.request("tools/call", {"name": "list_workers", "arguments": {}})
        assert ok["result"].get("isError") is not True, ok
    finally:
        code = raw.close()

    assert code == 0, raw.stderr.decode(errors="replace")
    assert raw._buffer == b"", f"a partial line was left on stdout: {raw._buffer!r}"
    for line in raw.lines:
        message = json.loads(line)  # every stdout line is one JSON-RPC message
        assert message.get("jsonrpc") == "2.0", line
    assert b"Traceback" not in raw.stderr, raw.stderr.decode(errors="replace")

    log_file = home / "logs" / "mcp-server.log"
    assert log_file.is_file(), "the server logs under $WORKER_BRIDGE_HOME/logs/"
    log = log_file.read_text()
    assert "worker-bridge MCP server" in log and str(home) in log
    assert "worker_status" in log, "the failed call is logged to the file"


async def test_the_client_session_leaves_the_server_log_under_the_state_root(home):
    async with mcp_server(home) as client:
        await assert_healthy(client)
        await call_error(client, "worker_status", {"task_id": "nope"})
    log = (home / "logs" / "mcp-server.log").read_text()
    assert "worker-bridge MCP server" in log
    assert "nope" in log


# -- several servers, one state root -----------------------------------------------------------


async def test_three_servers_sharing_a_state_root_keep_the_host_limit(home, workdir, docker_images):
    env = {"WORKER_BRIDGE_MAX_CONCURRENCY": "2"}
    repos = [make_repo(workdir, f"repo{i}") for i in range(6)]
    slow = {"sleep": 3, "write": {"done.txt": "done\n"}}
    task_ids: list[str] = []

    with EngineSampler(home) as sampler:
        async with AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(
                    mcp_server(home, env, stderr_to=workdir / f"server{i}.log")
                )
                for i in range(3)
            ]
            for i, client in enumerate(clients):
                for where in repos[2 * i : 2 * i + 2]:
                    queued = await delegate(client, where, slow, verify=["test -f done.txt"])
                    assert queued["status"] == "queued", queued
                    task_ids.append(queued["task_id"])
            results = {}
            with anyio.fail_after(90):
                for n, task_id in enumerate(task_ids):
                    results[task_id] = await wait_status(clients[n % 3], task_id, deadline_s=90)
            started = {
                task_id: [
                    e
                    for e in await read_all_events(clients[0], task_id)
                    if e["kind"] == "worker.started"
                ]
                for task_id in task_ids
            }

    assert len(set(task_ids)) == 6
    assert not sampler.errors, sampler.errors
    assert sampler.samples, "the engine was sampled"
    seen = {task for sample in sampler.samples for task, role in sample if role == "worker"}
    assert set(task_ids) <= seen, "every task's worker container was seen running"
    assert sampler.max_count() <= 2, "never more than two worker containers at once"
    assert sampler.max_count() == 2, "the capacity of two is used"
    for task_id, result in results.items():
        assert result["status"] == "succeeded", (task_id, result["error"])
        assert result["verification"]["ok"] is True
        assert len(started[task_id]) == 1, f"task {task_id} ran once"
