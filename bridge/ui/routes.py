"""The web view's pages and its read API: the task list, a task, its diff, a job. Every read is
one facade call (in a worker thread, so the event loop never waits on the store), bounded by
the bridge's scope like everywhere else: a task or job outside it is a 404, as an unknown id."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from bridge.errors import BridgeError, JobNotFound, TaskNotFound
from bridge.service import WorkerBridge
from bridge.ui import views
from bridge.ui.security import SESSION_COOKIE, Sessions, cookie_header

STATIC = Path(__file__).parent / "static"
MAX_DIFF_BYTES = 8 * 2**20  # a diff past this is shown cut, saying so

Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class UiState:
    bridge: WorkerBridge
    sessions: Sessions
    prefix: str = "/ui"
    streams: int = 0  # event streams open now (bridge/ui/sse.py bounds them)

    def signed_in(self, request: Request) -> bool:
        return self.sessions.get(request.cookies.get(SESSION_COOKIE)) is not None

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)


def unauthorized() -> JSONResponse:
    return JSONResponse(
        {"error": "Sign in first: open /ui/login with this server's token."}, status_code=401
    )


def error_response(exc: BridgeError) -> JSONResponse:
    """A refused verb as the CLI says it: one sentence (404 for an absent task or job)."""
    status = 404 if isinstance(exc, TaskNotFound | JobNotFound) else 409
    return JSONResponse({"error": exc.message}, status_code=status)


def api(state: UiState, handler: Handler) -> Handler:
    """A read of the API: only with a session (or any caller under --no-token)."""

    async def guarded(request: Request) -> Response:
        if state.sessions.needs_token and not state.signed_in(request):
            return unauthorized()
        try:
            response = await handler(request)
        except BridgeError as exc:
            return error_response(exc)
        response.headers.setdefault("cache-control", "no-store")
        return response

    return guarded


def page(state: UiState, name: str, check: Callable[[Request], Any] | None = None) -> Handler:
    """A page shell: with a session; without one, to the login (under --no-token a session is
    made on the spot). ``check`` answers 404 for an absent task or job."""

    async def serve(request: Request) -> Response:
        new_session = None
        if not state.signed_in(request):
            if state.sessions.needs_token:
                return RedirectResponse(f"{state.prefix}/login", status_code=303)
            new_session = state.sessions.open()
        if check is not None:
            try:
                await state.call(check, request)
            except (TaskNotFound, JobNotFound) as exc:
                return Response(exc.message, status_code=404, media_type="text/plain")
        response = FileResponse(
            STATIC / name, media_type="text/html", headers={"cache-control": "no-store"}
        )
        if new_session is not None:
            response.headers["set-cookie"] = cookie_header(new_session, state.prefix)
        return response

    return serve


def page_routes(state: UiState, prefix: str) -> list[Route]:
    bridge = state.bridge
    state.prefix = prefix

    async def session(request: Request) -> Response:
        current = state.sessions.get(request.cookies.get(SESSION_COOKIE))
        if current is None:
            return unauthorized()
        return JSONResponse({"csrf": current.csrf, "token": state.sessions.needs_token})

    async def task_list(request: Request) -> Response:
        status = request.query_params.get("status") or None
        cursor = (await state.call(bridge.events_since, -1)).next_after  # before the list
        tasks = await state.call(bridge.list_tasks, status, 500)
        jobs = await state.call(bridge.list_jobs, 100)
        return JSONResponse(
            {
                "tasks": [views.task_row(t) for t in tasks],
                "jobs": [views.job_row(j) for j in jobs],
                "cursor": cursor,
            }
        )

    async def task(request: Request) -> Response:
        result = await state.call(bridge.get_task, request.path_params["task_id"])
        return JSONResponse(views.task_page(result))

    async def diff(request: Request) -> Response:
        result = await state.call(bridge.get_task, request.path_params["task_id"])
        text = await state.call(views.diff_text, result, MAX_DIFF_BYTES)
        return Response(text, media_type="text/plain; charset=utf-8")

    async def job(request: Request) -> Response:
        result = await state.call(bridge.job_status, request.path_params["job_id"])
        return JSONResponse(views.job_page(result))

    def task_exists(request: Request) -> None:
        bridge.get_task(request.path_params["task_id"])

    def job_exists(request: Request) -> None:
        bridge.job_status(request.path_params["job_id"])

    return [
        Route(f"{prefix}/", page(state, "index.html")),
        Route(f"{prefix}/tasks/{{task_id}}", page(state, "task.html", task_exists)),
        Route(f"{prefix}/jobs/{{job_id}}", page(state, "job.html", job_exists)),
        Route(f"{prefix}/api/session", session),
        Route(f"{prefix}/api/tasks", api(state, task_list)),
        Route(f"{prefix}/api/tasks/{{task_id}}", api(state, task)),
        Route(f"{prefix}/api/tasks/{{task_id}}/diff", api(state, diff)),
        Route(f"{prefix}/api/jobs/{{job_id}}", api(state, job)),
    ]
