"""MCP tasks (the 2025-11-25 revision's utility) over worker-bridge's own durable tasks and jobs.

A host that declares nothing keeps today's tools. One on the 2025-11-25 handshake sees
`capabilities.tasks` and `execution.taskSupport: "optional"` on the tools that start work
(TASK_TOOLS); a `tools/call` of one with `task` set starts the work as `wait: false` would and
answers at once with a `CreateTaskResult` whose task id is worker-bridge's own task id (a job's
id for compete and review). Then:

- `tasks/get`: where it is (`working`, `input_required` while the worker waits for an answer,
  `completed`, `failed`, `cancelled`), a `statusMessage` saying so in words, and how often to
  poll;
- `tasks/result`: waits until the task or job ended and returns what the tool with
  `wait: true` returns (a task whose worker waits for an answer: at once, saying to answer it);
- `tasks/list`: the recent tasks and jobs;
- `tasks/cancel`: cancels it, as `worker_cancel` / `worker_job_cancel` do.

Every answer is read from the store, so any server process of the state root answers for any
task, after a restart too; and through the same facade as the tools, so the `repositories`
bound and (over HTTP) the token hold for each method: a task outside them is not found.
Not yet: the 2026-07-28 `io.modelcontextprotocol/tasks` extension, `notifications/tasks/status`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mcp.server.context import CallNext, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    CallToolResult,
    CancelTaskRequestParams,
    GetTaskPayloadRequestParams,
    GetTaskRequestParams,
    PaginatedRequestParams,
    ServerTasksCapability,
    ServerTasksRequestsCapability,
    Task,
    TasksCallCapability,
    TasksCancelCapability,
    TasksListCapability,
    TasksToolsCapability,
    ToolExecution,
)

from bridge.errors import BridgeError, JobNotFound, TaskNotFound
from bridge.mcp.calls import BridgeCalls, for_tools
from bridge.mcp.results import job_answer, task_answer
from bridge.mcp.waiting import wait_settled
from bridge.models import JOB_TERMINAL, SETTLED, TERMINAL
from bridge.records import JobResult, TaskResult

ERA = "2025-11-25"
TASK_TOOLS = frozenset({"worker_delegate", "worker_follow_up", "worker_compete", "worker_review"})
JOB_TOOLS = frozenset({"worker_compete", "worker_review"})
POLL_INTERVAL_MS = 2000
LISTED = 50
CAPABILITY = ServerTasksCapability(
    list=TasksListCapability(),
    cancel=TasksCancelCapability(),
    requests=ServerTasksRequestsCapability(tools=TasksToolsCapability(call=TasksCallCapability())),
)
_TASK_STATUS = {
    "waiting_input": "input_required",
    "succeeded": "completed",
    "accepted": "completed",
    "rejected": "completed",
    "failed": "failed",
    "timed_out": "failed",
    "cancelled": "cancelled",
}
_JOB_STATUS = {
    "succeeded": "completed",
    "unresolved": "completed",
    "accepted": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


class TasksServer(MCPServer):
    """The SDK's server, with the tasks capability and the tools' `execution` for hosts on
    the 2025-11-25 handshake (the capability is that revision's only)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        low = self._lowlevel_server  # the SDK has no other way to add a spec capability
        plain = low.get_capabilities

        def get_capabilities(*args: Any, **kwargs: Any) -> Any:
            found = plain(*args, **kwargs)
            if kwargs.get("protocol_version") is not None:
                return found  # `server/discover`'s, of the 2026-07-28 protocol: no tasks there
            return found.model_copy(update={"tasks": CAPABILITY})  # the handshake's

        low.get_capabilities = get_capabilities  # type: ignore[method-assign]

    async def list_tools(self) -> list[Any]:
        optional = ToolExecution(task_support="optional")
        return [
            tool.model_copy(update={"execution": optional}) if tool.name in TASK_TOOLS else tool
            for tool in await super().list_tools()
        ]


class BridgeTasks(Extension):
    """tasks/get, tasks/result, tasks/list, tasks/cancel (this extension's methods, served
    only on the 2025-11-25 handshake), and `tools/call` with `task` (`middleware`)."""

    identifier = "io.github.worker-bridge/tasks-2025-11-25"

    def __init__(self, call: BridgeCalls) -> None:
        self.call = call
        self.bridge = call.bridge

    def methods(self) -> list[MethodBinding]:
        era = frozenset({ERA})
        return [
            MethodBinding("tasks/get", GetTaskRequestParams, self._get, era),
            MethodBinding("tasks/result", GetTaskPayloadRequestParams, self._result, era),
            MethodBinding("tasks/list", PaginatedRequestParams, self._list, era),
            MethodBinding("tasks/cancel", CancelTaskRequestParams, self._cancel, era),
        ]

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        """A `tools/call` of a TASK_TOOLS tool with `task` (2025-11-25): the tool run as with
        `wait: false` and a `CreateTaskResult` returned for the task or job it started. A
        middleware, not a `tools/call` interceptor: the SDK checks an interceptor's result
        against the plain `CallToolResult` of that revision and would refuse this one."""
        params = ctx.params or {}
        if ctx.method != "tools/call" or ctx.protocol_version != ERA or params.get("task") is None:
            return await call_next(ctx)
        name = params.get("name")
        if name not in TASK_TOOLS:  # as the revision asks of a tool without taskSupport
            raise MCPError(
                METHOD_NOT_FOUND,
                f"Tool {str(name)[:80]} does not run as a task; call it without `task`.",
            )
        given = params.get("arguments") or {}
        if not isinstance(given, dict):
            raise MCPError(INVALID_PARAMS, f"The arguments of {name} must be an object.")
        plain = {k: v for k, v in params.items() if k != "task"}
        plain["arguments"] = {**given, "wait": False}
        started = await call_next(dataclasses.replace(ctx, params=plain))
        if not isinstance(started, dict) or started.get("isError"):
            return started  # not started: the tool's own error, and no task was made
        found = started.get("structuredContent") or {}
        # A job's for compete and review; else the task's own (a follow-up's task is in a job
        # too when it was a candidate: its job_id is not the work this call started).
        work_id = found.get("job_id") if name in JOB_TOOLS else found.get("task_id")
        return {"task": _wire(self._task(await self._work(str(work_id))))}

    # -- the methods ------------------------------------------------------------------------

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
        return _wire(self._task(await self._work(params.task_id)))

    async def _result(self, ctx: ServerRequestContext[Any, Any], params: Any) -> CallToolResult:
        """What `wait: true` returns, once the work ended; for a task whose worker waits for
        an answer, at once, with `next` saying to answer it (nothing else would end the wait:
        a question put to the user here is not done yet)."""
        work, _ = await wait_settled(
            lambda: self._work(params.task_id), _settled, _nowhere, None, return_after_s=math.inf
        )
        if isinstance(work, JobResult):
            return job_answer(work)
        said = None
        if work.status == "waiting_input":
            said = (
                f"Task {work.task_id} waits for an answer to its pending request(s): answer "
                "each with worker_answer (task_id, request_id), then ask for tasks/result again."
            )
        return task_answer(work, said)

    async def _list(self, ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
        tasks = await self._called(self.bridge.list_tasks, None, LISTED)
        jobs = await self._called(self.bridge.list_jobs, LISTED)
        found = sorted([*tasks, *jobs], key=lambda w: w.created_at, reverse=True)[:LISTED]
        return {"tasks": [_wire(self._task(w)) for w in found]}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
        work = await self._work(params.task_id)
        if _ended(work):
            raise MCPError(
                INVALID_PARAMS,
                f"Cannot cancel task {params.task_id}: it is already {work.status}.",
            )
        if isinstance(work, JobResult):
            work = await self._called(self.bridge.cancel_job, work.job_id)
        else:
            work = await self._called(self.bridge.cancel_task, work.task_id)
        return _wire(self._task(work))

    # -- the pieces -------------------------------------------------------------------------

    async def _work(self, work_id: str) -> TaskResult | JobResult:
        """The task, else the job, of that id; MCPError (invalid params) for neither."""
        try:
            return await self.call.plain(self.bridge.get_task, work_id)
        except TaskNotFound:
            pass
        try:
            return await self.call.plain(self.bridge.job_status, work_id)
        except JobNotFound as exc:
            said = TaskNotFound.of(work_id).message  # the same words for both
            raise MCPError(INVALID_PARAMS, f"Failed to retrieve task: {for_tools(said)}") from exc

    async def _called(self, fn: Any, *args: Any) -> Any:
        try:
            return await self.call.plain(fn, *args)
        except BridgeError as exc:
            raise MCPError(INVALID_PARAMS, for_tools(exc.message)) from exc

    def _task(self, work: TaskResult | JobResult) -> Task:
        if isinstance(work, JobResult):
            status = _JOB_STATUS.get(str(work.status), "working")
            ended = sum(1 for t in work.tasks if t.status in TERMINAL)
            said = f"job {work.status}: {ended} of {len(work.tasks)} tasks ended"
        else:
            status = _TASK_STATUS.get(str(work.status), "working")
            said = f"{work.status}" + (f" ({work.phase})" if work.phase else "")
            if work.error is not None:
                said += f": {for_tools(work.error.message)}"
        return Task(
            task_id=_id_of(work),
            status=status,
            status_message=said[:500],
            created_at=work.created_at,
            last_updated_at=_updated(work),
            ttl=None,  # kept until pruned
            poll_interval=POLL_INTERVAL_MS,
        )


def _wire(task: Task) -> dict[str, Any]:
    """The task as the wire has it: `ttl` always there (null: kept until pruned), which the
    SDK's own dump, leaving out every None, would drop and a client's schema requires."""
    return {**task.model_dump(by_alias=True, exclude_none=True, mode="json"), "ttl": task.ttl}


def _ended(work: TaskResult | JobResult) -> bool:
    if isinstance(work, JobResult):
        return work.status in JOB_TERMINAL
    return work.status in TERMINAL


def _settled(work: TaskResult | JobResult) -> bool:
    """Ended; or, for a task, waiting for an answer, which nothing here would end."""
    return _ended(work) or (isinstance(work, TaskResult) and work.status in SETTLED)


async def _nowhere(work: TaskResult | JobResult) -> str:
    return ""  # tasks/result reports no progress: its client polls tasks/get


def _updated(work: TaskResult | JobResult) -> str:
    """When it last changed: a job's when it ended (its tasks say more), a task's record's."""
    if isinstance(work, JobResult):
        return work.finished_at or work.created_at
    return work.finished_at or work.updated_at or work.created_at


def _id_of(work: TaskResult | JobResult) -> str:
    return work.job_id if isinstance(work, JobResult) else work.task_id
