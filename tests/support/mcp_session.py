"""An MCP client's side of the tests: the eight tools' names, `worker-bridge-mcp` started as a
stdio subprocess with an initialised SDK client session on it (the SDK's default protocol, or the
2025-11-25 handshake: `legacy_session`), tool calls that must succeed or must fail as tool
errors, bounded polls of a task's status and events, and a task of another repository."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from support.cli import MCP_SERVER
from support.tasks import TERMINAL

MCP_TOOLS = {
    "worker_compete",
    "worker_review",
    "worker_job_status",
    "worker_job_accept",
    "worker_job_cancel",
    "worker_delegate",
    "worker_status",
    "list_workers",
    "worker_cancel",
    "worker_logs",
    "worker_prune",
    "worker_accept",
    "worker_follow_up",
    "worker_answer",
}
REQUEST_TIMEOUT_S = 90  # bounds every request of a client session, the handshake too
POLL_S = 0.1
TOKEN_VARS = ("WORKER_BRIDGE_MCP_TOKEN", "WORKER_BRIDGE_MCP_TOKEN_FILE")


def server_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A server's environment: the test's state root, and no token but the ones a test passes
    on purpose."""
    env = {k: v for k, v in os.environ.items() if k not in TOKEN_VARS}
    return {**env, "WORKER_BRIDGE_HOME": str(home), **(extra or {})}


@asynccontextmanager
async def mcp_server(
    home: Path, env: dict[str, str] | None = None, *, stderr_to: Path | None = None
) -> AsyncIterator[Client]:
    """One server process and an initialised client session on it. Anything on the server's
    stdout that is not a protocol message reaches the client as an exception; none may."""
    stray: list[Exception] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, Exception):
            stray.append(message)

    errlog_path = stderr_to or home.parent / f"mcp-stderr-{time.monotonic_ns()}.log"
    command, *args = MCP_SERVER
    params = StdioServerParameters(command=command, args=args, env=server_env(home, env))
    with open(errlog_path, "a") as errlog:
        async with Client(
            stdio_client(params, errlog=errlog),
            message_handler=on_message,
            read_timeout_seconds=REQUEST_TIMEOUT_S,
        ) as client:
            yield client
    assert not stray, f"non-protocol output on the server's stdout: {stray!r}"
    assert "Traceback" not in errlog_path.read_text(), errlog_path.read_text()


@asynccontextmanager
async def legacy_session(home: Path, **client: Any) -> AsyncIterator[Client]:
    """A server process and a client session on the 2025-11-25 handshake (where the server
    offers MCP tasks and may ask the client in the middle of a call), with ``client``'s own
    arguments (an elicitation_callback...)."""
    command, *args = MCP_SERVER
    params = StdioServerParameters(command=command, args=args, env=server_env(home))
    with open(home.parent / "mcp-legacy-stderr.log", "a") as errlog:
        async with Client(
            stdio_client(params, errlog=errlog),
            mode="legacy",
            read_timeout_seconds=REQUEST_TIMEOUT_S,
            **client,
        ) as session:
            yield session


def task_elsewhere(home: Path, workdir: Path, mock: dict, *, start: bool = False) -> str:
    """A task of another repository than the `repo` fixture's, made in ``home`` by a bridge
    without a `repositories` bound (and started when ``start``): for a bounded server to not
    see."""
    from support.repos import make_repo

    from bridge import WorkerBridge

    other = make_repo(workdir, "other")
    bridge = WorkerBridge(home=home)
    try:
        spec = {
            "objective": "x",
            "worker": "mock",
            "workspace": {"repository": str(other)},
            "metadata": {"mock": mock},
        }
        task_id = bridge.create_task(spec).task_id
        if start:
            bridge.start_detached(task_id)
        return task_id
    finally:
        bridge.close()


async def call(client: Client, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call a tool that must succeed; returns its structured result."""
    result = await client.call_tool(name, args or {})
    text = result.content[0].text if result.content else ""
    assert not result.is_error, f"{name}({args}) failed: {text}"
    assert isinstance(result.structured_content, dict), (name, result)
    # the text content is a few lines for the model, not the document a second time
    assert text.strip() and len(text) < 4000, text
    assert not text.lstrip().startswith("{"), text
    return result.structured_content


async def call_error(client: Client, name: str, args: dict[str, Any]) -> str:
    """Call a tool that must fail as a tool error (isError); returns its message."""
    result = await client.call_tool(name, args)
    text = result.content[0].text if result.content else ""
    assert result.is_error, f"{name}({args}) should have failed, got {text}"
    assert text.strip(), "a tool error carries a message"
    assert "Traceback" not in text, text
    return text


async def delegate(client: Client, repo: Path, mock: dict, **args: Any) -> dict[str, Any]:
    """worker_delegate of a mock task on REPO."""
    return await call(
        client,
        "worker_delegate",
        {
            "objective": args.pop("objective", "test task"),
            "repository": str(repo),
            "metadata": {"mock": mock},
            **args,
        },
    )


async def wait_status(
    client: Client, task_id: str, until: set[str] = TERMINAL, deadline_s: float = 60
) -> dict[str, Any]:
    """worker_status, polled until the task's status is one of UNTIL."""
    with anyio.fail_after(deadline_s):
        while True:
            result = await call(client, "worker_status", {"task_id": task_id})
            if result["status"] in until:
                return result
            await anyio.sleep(POLL_S)


async def wait_event(
    client: Client, task_id: str, kind: str, deadline_s: float = 30
) -> dict[str, Any]:
    """worker_logs, paged until an event of KIND appears."""
    after = 0
    with anyio.fail_after(deadline_s):
        while True:
            page = await call(client, "worker_logs", {"task_id": task_id, "after": after})
            for event in page["events"]:
                if event["kind"] == kind:
                    return event
            after = page["next_after"]
            await anyio.sleep(POLL_S)


def cancel_unfinished(home: Path) -> None:
    """Cancel every unfinished task of a state root (which kills its containers): detached
    runners outlive the server that spawned them."""
    from bridge import WorkerBridge

    bridge = WorkerBridge(home=home)
    try:
        if not bridge.config.store_path.exists():
            return
        for task in bridge.list_tasks():
            if task.status not in TERMINAL:
                bridge.cancel_task(task.task_id)
    finally:
        bridge.close()
