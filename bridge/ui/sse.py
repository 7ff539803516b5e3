"""Server-sent events for the pages, fed from the store's events: a loop on the server reads the
events after its cursor (the event id, also the SSE `id`: the page reads the stream with fetch(),
which can send the session's key, and reconnects with `?after=` the last id it got) and pushes
what changed; the page only listens.

- `/ui/api/stream`: every task and job in scope; a `task` message carries the task's new list
  row, a `job` message the job's.
- `/ui/api/tasks/{id}/stream`: one task's events as the CLI's live view prints them (`line`),
  and `changed` when the task's result may have moved on (its page then reads it again).

Streams are bounded: MAX_STREAMS per server, MAX_STREAMS_PER_CLIENT per client address (on the
MCP listener they share the per-client connection cap with the agents' MCP connections, which
must not be starved by a few browser tabs); each ends when its client goes away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bridge.errors import BridgeError, TaskNotFound
from bridge.listener.limits import client_key
from bridge.records import Event
from bridge.ui import views
from bridge.ui.routes import PREFIX, UiState, api

POLL_S = 0.25
KEEPALIVE_S = 15.0
PAGE = 200
MAX_STREAMS = 32
MAX_STREAMS_PER_CLIENT = 8  # of http.max_connections_per_client (32 by default)
MAX_CURSOR = 2**63 - 1  # an event id is a SQLite integer
QUIET_KINDS = {"worker.progress", "environment.output", "network.request"}  # no result change


def _message(kind: str, data: Any, event_id: int) -> str:
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data, ensure_ascii=True)}\n\n"


def _cursor(request: Request) -> int:
    text = request.headers.get("last-event-id") or request.query_params.get("after") or "-1"
    try:
        return min(MAX_CURSOR, max(-1, int(text[:40])))
    except ValueError:
        return -1


def stream_routes(state: UiState) -> list[Route]:
    bridge = state.bridge

    async def everything(request: Request) -> Response:
        session = state.session_of(request)
        return _open(state, request, _all_events(state, _cursor(request), session))

    async def one_task(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        await state.call(bridge.get_task, task_id)  # 404 before the stream opens
        cursor, session = max(0, _cursor(request)), state.session_of(request)
        return _open(state, request, _task_events(state, task_id, cursor, session))

    return [
        Route(f"{PREFIX}/api/stream", api(state, everything)),
        Route(f"{PREFIX}/api/tasks/{{task_id}}/stream", api(state, one_task)),
    ]


def _open(state: UiState, request: Request, messages: AsyncIterator[str]) -> Response:
    client = client_key(request.client.host if request.client else "")
    if sum(state.streams.values()) >= MAX_STREAMS:
        refusal = f"This server already has {MAX_STREAMS} live views open; close some."
    elif state.streams.get(client, 0) >= MAX_STREAMS_PER_CLIENT:
        refusal = f"You already have {MAX_STREAMS_PER_CLIENT} live views open; close some."
    else:
        return _CountedStream(state, client, _with_retry(messages))
    return JSONResponse({"error": refusal}, status_code=503)


class _CountedStream(StreamingResponse):
    """A stream counted from the moment it is granted (so a burst of opens cannot all pass the
    check before any is counted) until its answer ends, however it ends: Starlette sends a
    response right after its handler returns it."""

    def __init__(self, state: UiState, client: str, messages: AsyncIterator[str]) -> None:
        super().__init__(
            messages,
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )
        self._state, self._client = state, client
        state.streams[client] = state.streams.get(client, 0) + 1

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            streams = self._state.streams
            streams[self._client] -= 1
            if not streams[self._client]:
                del streams[self._client]


async def _with_retry(messages: AsyncIterator[str]) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    async for message in messages:
        yield message


async def _follow(
    state: UiState, cursor: int, read: Any, session: str | None
) -> AsyncIterator[tuple[list[Event], int] | None]:
    """Pages of new events as they come (None now and then: time for a keep-alive), while the
    stream's session lasts: signed out, evicted or expired, the stream ends (its page then
    opens it again, and is sent to the login)."""
    quiet = 0.0
    while True:
        if not state.sessions.is_live(session):
            return
        try:
            page = await state.call(read, cursor)
        except BridgeError:  # the task went out of reach (pruned, scope changed): stream ends
            return
        except (RecursionError, OverflowError):  # a cursor past what the store holds: ends too
            return
        cursor = page.next_after
        if page.events:
            quiet = 0.0
            yield page.events, cursor
            if len(page.events) >= PAGE:
                continue
        await asyncio.sleep(POLL_S)
        quiet += POLL_S
        if quiet >= KEEPALIVE_S:
            quiet = 0.0
            yield None


async def _all_events(state: UiState, cursor: int, session: str | None) -> AsyncIterator[str]:
    bridge = state.bridge
    if cursor < 0:
        cursor = (await state.call(bridge.events_since, -1)).next_after

    def read(after: int) -> Any:
        return bridge.events_since(after, PAGE)

    async for batch in _follow(state, cursor, read, session):
        if batch is None:
            yield ": keep-alive\n\n"
            continue
        events, last = batch
        for owner in dict.fromkeys(e.task_id for e in events if e.kind not in QUIET_KINDS):
            kind, row = await state.call(_row_of, state, owner)
            if row is not None:
                yield _message(kind, row, last)
        yield f"id: {last}\n\n"  # the cursor moves past quiet events too


def _row_of(state: UiState, owner: str) -> tuple[str, views.TaskRow | views.JobRow | None]:
    """The list row of an event's owner, a task or a job (None: neither is in reach)."""
    try:
        return "task", views.task_row(state.bridge.get_task(owner))
    except TaskNotFound:
        pass
    try:
        return "job", views.job_row(state.bridge.job_status(owner))
    except BridgeError:
        return "job", None


async def _task_events(
    state: UiState, task_id: str, cursor: int, session: str | None
) -> AsyncIterator[str]:
    def read(after: int) -> Any:
        return state.bridge.task_logs(task_id, after=after, limit=PAGE)

    async for batch in _follow(state, cursor, read, session):
        if batch is None:
            yield ": keep-alive\n\n"
            continue
        events, last = batch
        changed = False
        for event in events:
            line = views.event_line(event)
            if line is not None:
                yield _message("line", line, event.event_id)
            changed = changed or event.kind not in QUIET_KINDS
        if changed:
            yield _message("changed", {"task_id": task_id}, last)
        else:
            yield f"id: {last}\n\n"
