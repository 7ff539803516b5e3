"""The web view's pages and its read API: the task list, a task, its diff, a job. Every read is
one facade call (in a worker thread, so the event loop never waits on the store), bounded by
the bridge's scope like everywhere else: a task or job outside it is a 404, as an unknown id.

A page shell is static HTML and needs only the session cookie; every read of data needs the
session's key too (`X-UI-Key`, bridge/ui/security.py), which the page's script sends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from bridge.errors import BridgeError, JobNotFound, TaskNotFound
from bridge.listener.limits import RefusalLog
from bridge.models import Status
from bridge.service import WorkerBridge
from bridge.ui import views
from bridge.ui.security import KEY_HEADER, Sessions

PREFIX = "/ui"  # where the view lives, on its own listener and on the MCP one (the JS says it too)
STATIC = Path(__file__).parent / "static"
MAX_DIFF_BYTES = 8 * 2**20  # a diff past this is shown cut, saying so

Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class UiState:
    bridge: WorkerBridge
    sessions: Sessions
    refusals: RefusalLog = field(default_factory=RefusalLog)
    streams: dict[str, int] = field(default_factory=dict)  # open event streams per client

    def session_of(self, request: Request) -> str | None:
        """The request's session id when it carries both the cookie and the key. A live
        cookie without its key is what another local page or process that got hold of the
        cookie would send: logged (once per client per interval), then refused as any."""
        session_id = self.sessions.authorized(request.cookies, request.headers.get(KEY_HEADER))
        if session_id is None and self.sessions.has_cookie(request.cookies):
            client = request.client.host if request.client else "?"
            self.refusals.warn(
                client,
                "ui key",
                f"ui: refused a request from {client} with the session cookie but without its "
                "key (another page or process may hold the cookie)",
            )
        return session_id

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


UNREADABLE = (
    "The request could not be handled: it is nested too deeply or holds a number too large."
)


def unreadable() -> JSONResponse:
    """RecursionError or OverflowError while handling a request (input nested past a parser's
    depth, a number past what the store holds): the client's doing, a 400 in one sentence,
    never a 500 with a traceback."""
    return JSONResponse({"error": UNREADABLE}, status_code=400)


def api(state: UiState, handler: Handler) -> Handler:
    """A read of the API: only with a whole session (the cookie and its key)."""

    async def guarded(request: Request) -> Response:
        if state.session_of(request) is None:
            return unauthorized()
        try:
            response = await handler(request)
        except BridgeError as exc:
            return error_response(exc)
        except (RecursionError, OverflowError):
            return unreadable()
        response.headers.setdefault("cache-control", "no-store")
        return response

    return guarded


def page(state: UiState, name: str) -> Handler:
    """A page shell (static: the data comes from the API, with the key): with the session
    cookie; without one, to the login. Under `--no-token` too: no page makes a session."""

    async def serve(request: Request) -> Response:
        if not state.sessions.has_cookie(request.cookies):
            return RedirectResponse(f"{PREFIX}/login", status_code=303)
        return FileResponse(
            STATIC / name, media_type="text/html", headers={"cache-control": "no-store"}
        )

    return serve


def page_routes(state: UiState) -> list[Route]:
    bridge = state.bridge

    async def task_list(request: Request) -> Response:
        status = request.query_params.get("status") or None
        if status is not None and status not in {str(s) for s in Status}:
            return JSONResponse({"error": f"No task status '{status}'."}, status_code=400)
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
        return JSONResponse(await state.call(views.diff_document, result, MAX_DIFF_BYTES))

    async def job(request: Request) -> Response:
        cursor = (await state.call(bridge.events_since, -1)).next_after  # before the job
        result = await state.call(bridge.job_status, request.path_params["job_id"])
        return JSONResponse({**views.job_page(result), "cursor": cursor})

    return [
        Route(f"{PREFIX}/", page(state, "index.html")),
        Route(f"{PREFIX}/tasks/{{task_id}}", page(state, "task.html")),
        Route(f"{PREFIX}/jobs/{{job_id}}", page(state, "job.html")),
        Route(f"{PREFIX}/api/tasks", api(state, task_list)),
        Route(f"{PREFIX}/api/tasks/{{task_id}}", api(state, task)),
        Route(f"{PREFIX}/api/tasks/{{task_id}}/diff", api(state, diff)),
        Route(f"{PREFIX}/api/jobs/{{job_id}}", api(state, job)),
    ]


async def read_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None when it is larger than ``limit`` bytes (read no further)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return body
