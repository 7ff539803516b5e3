"""MCP tasks (bridge/mcp/tasks.py) as the official Python SDK's sessions see them: on the
2025-11-25 handshake (`mode="legacy"`), a task another server process started answered by this
one (`tasks/get`, `tasks/result`, `tasks/list`); under a `repositories` bound, another
repository's task id on every method, answered as an unknown one and left running; and a
2026-07-28 session, which declares neither form, keeps today's tools without tasks. (The host's
side of creating one, polling it and cancelling it: test_interop.py, with the TypeScript SDK's
task client, which the Python SDK does not have.)"""

from __future__ import annotations

import anyio
import mcp.types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from support.asking import block
from support.mcp_session import (
    call,
    cancel_unfinished,
    delegate,
    legacy_session,
    mcp_server,
    task_elsewhere,
    wait_status,
)
from support.tasks import TERMINAL

from bridge import WorkerBridge

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_task_outlives_the_test")]


async def get(client: Client, task_id: str) -> types.GetTaskResult:
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return await client.session.send_request(request, types.GetTaskResult)


async def result(client: Client, task_id: str) -> types.CallToolResult:
    params = types.GetTaskPayloadRequestParams(task_id=task_id)
    request = types.GetTaskPayloadRequest(params=params)
    return await client.session.send_request(request, types.CallToolResult)


async def cancel(client: Client, task_id: str) -> types.CancelTaskResult:
    request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
    return await client.session.send_request(request, types.CancelTaskResult)


async def test_another_server_process_answers_for_a_task_and_waits_for_its_result(
    home, repo, docker_images
):
    mock = {"sleep": 2, "write": {"later.txt": "l\n"}}
    async with mcp_server(home) as first:  # a 2026-07-28 session: plain tools
        task_id = (await delegate(first, repo, mock, verify=["test -f later.txt"]))["task_id"]
    async with legacy_session(home) as second:
        assert second.session.server_capabilities.tasks is not None
        tools = {t.name: t for t in (await second.list_tools()).tools}
        assert tools["worker_delegate"].execution.task_support == "optional"
        assert tools["worker_status"].execution is None  # reading needs no task
        working = await get(second, task_id)
        done = await result(second, task_id)  # blocks until the task ended
        ended = await get(second, task_id)
        listed = await second.session.send_request(types.ListTasksRequest(), types.ListTasksResult)
        status = await call(second, "worker_status", {"task_id": task_id})
    assert working.task_id == task_id and working.status in {"working", "completed"}
    assert working.poll_interval and working.ttl is None
    assert done.structured_content == status  # what worker_status and wait=true return
    assert status["status"] == "succeeded"
    assert ended.status == "completed" and ended.status_message == "succeeded"
    assert [(t.task_id, t.status) for t in listed.tasks] == [(task_id, "completed")]


async def test_a_bounded_server_answers_another_repositorys_task_as_unknown_and_leaves_it(
    home, repo, workdir, docker_images
):
    foreign = task_elsewhere(home, workdir, {"sleep": 30}, start=True)
    (home / "config.yaml").write_text(f"repositories:\n  - {repo}\n")
    said = {}
    async with legacy_session(home) as client:
        for name, method in (("get", get), ("result", result), ("cancel", cancel)):
            with pytest.raises(MCPError) as refused:
                await method(client, foreign)
            said[name] = str(refused.value).replace(foreign, "ID")
        with pytest.raises(MCPError) as unknown:
            await get(client, "feedfacecafe")
        listed = await client.session.send_request(types.ListTasksRequest(), types.ListTasksResult)
    expected = str(unknown.value).replace("feedfacecafe", "ID")
    assert set(said.values()) == {expected}, (said, expected)
    assert "Failed to retrieve task" in expected
    assert listed.tasks == []
    bridge = WorkerBridge(home=home, repositories=[])  # unbounded again, to look
    try:
        assert bridge.get_task(foreign).status not in TERMINAL | {"cancelled"}
        bridge.cancel_task(foreign)
    finally:
        bridge.close()


async def test_a_session_that_declares_no_tasks_keeps_todays_tools(home):
    async with mcp_server(home) as client:  # the SDK's default: the 2026-07-28 protocol
        assert client.protocol_version == "2026-07-28"
        capabilities = client.session.server_capabilities
        tools = (await client.list_tools()).tools
        with pytest.raises(MCPError, match="Method not found"):
            await get(client, "feedfacecafe")
    assert capabilities.tasks is None
    assert all(t.execution is None for t in tools)


async def test_a_task_waiting_for_an_answer_is_input_required_and_its_result_says_how_on(
    home, repo, docker_images
):
    question = {"kind": "question", "text": "Which database?", "choices": ["sqlite", "redis"]}
    mock = {"summary": "One question first.\n" + block(question)}
    async with mcp_server(home) as first:
        task_id = (await delegate(first, repo, mock))["task_id"]
        await wait_status(first, task_id, {"waiting_input", "failed"})
    async with legacy_session(home) as client:
        asked = await get(client, task_id)
        with anyio.fail_after(30):  # answered at once: nothing else would end this wait
            found = await result(client, task_id)
        plain = types.CallToolRequestParams(
            name="worker_status", arguments={"task_id": task_id}, task=types.TaskMetadata()
        )
        with pytest.raises(MCPError) as refused:  # a tool without taskSupport, as a task
            await client.session.send_request(
                types.CallToolRequest(params=plain), types.CallToolResult
            )
        cancel_unfinished(home)
    assert asked.status == "input_required" and asked.status_message == "waiting_input"
    document = found.structured_content
    assert document["status"] == "waiting_input"
    assert "worker_answer" in document["next"] and task_id in document["next"]
    assert refused.value.error.code == types.METHOD_NOT_FOUND
    assert "does not run as a task" in str(refused.value)
