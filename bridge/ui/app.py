"""The web view's ASGI app (Starlette, served by uvicorn): every path under `/ui`, behind the
gate of bridge/ui/security.py. `worker-bridge ui` serves it alone (see `serve`); the MCP HTTP
listener mounts the same app beside `/mcp` (bridge/mcp_http.py).

The pages are static shells (bridge/ui/static) whose scripts read the JSON API and the event
streams; nothing a worker wrote is ever put into HTML on the server.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from bridge.mcp_http_limits import ASGIApp, Receive, Scope, Send
from bridge.service import WorkerBridge
from bridge.ui import actions, routes, sse
from bridge.ui.security import (
    SECURITY_HEADERS,
    SESSION_COOKIE,
    HostPolicy,
    Sessions,
    cookie_header,
    expired_cookie_header,
    origin_refusal,
)

log = logging.getLogger("worker_bridge.ui")

PREFIX = "/ui"
STATIC = Path(__file__).parent / "static"
MAX_LOGIN_BODY = 4096


class Gate:
    """Outermost layer: Host and Origin checks on everything, the security headers on every
    answer, and no page or API without a session."""

    def __init__(self, app: ASGIApp, sessions: Sessions, hosts: HostPolicy) -> None:
        self.app = app
        self.sessions = sessions
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = None
        if not self.hosts.allows(headers.get("host")):
            refusal = (421, "This server does not answer for that host name.")
        else:
            action = scope["method"] not in ("GET", "HEAD")
            why = origin_refusal(headers, action=action)
            if why is not None:
                refusal = (403, f"Refused: {why}.")
        if refusal is not None:
            client = scope.get("client") or ("?", 0)
            log.warning("ui: refused %s from %s: %s", scope["method"], client[0], refusal[1])
            response = JSONResponse({"error": refusal[1]}, status_code=refusal[0])
            return await response(scope, receive, send_with_headers)
        await self.app(scope, receive, send_with_headers)


def build_app(bridge: WorkerBridge, *, token: str | None, host: str) -> ASGIApp:
    """The web view for ``bridge``: its pages need a session, got with ``token`` (None:
    `--no-token`, loopback only: a session for whoever asks)."""
    sessions = Sessions(token)
    state = routes.UiState(bridge=bridge, sessions=sessions)

    async def login(request: Request) -> Response:
        return await _login(request, sessions)

    async def logout(request: Request) -> Response:
        if not sessions.csrf_ok(
            request.cookies.get(SESSION_COOKIE), request.headers.get("x-csrf-token")
        ):
            return JSONResponse({"error": "Refused: no valid session."}, status_code=403)
        sessions.close(request.cookies.get(SESSION_COOKIE))
        response = JSONResponse({"ok": True})
        response.headers["set-cookie"] = expired_cookie_header(PREFIX)
        return response

    app = Starlette(
        routes=[
            Route(PREFIX, lambda r: RedirectResponse(f"{PREFIX}/", 303)),
            Route(f"{PREFIX}/login", login, methods=["GET", "POST"]),
            Route(f"{PREFIX}/logout", logout, methods=["POST"]),
            Mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="static"),
            *routes.page_routes(state, PREFIX),
            *sse.stream_routes(state, PREFIX),
            *actions.action_routes(state, PREFIX),
        ]
    )
    return Gate(app, sessions, HostPolicy(host))


async def _login(request: Request, sessions: Sessions) -> Response:
    """GET with `?token=` or POST of the login form: the token exchanged for a session cookie,
    then a redirect to the list, so the token stays neither in the URL nor in the page."""
    if request.method == "POST":
        body = await _bounded_body(request)
        presented = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0]
    else:
        presented = request.query_params.get("token", "")
        if not presented and not sessions.needs_token:
            presented = "-"
    if not presented:
        return _login_page()
    if not sessions.token_matches(presented):
        return _login_page("That is not this server's token.", status=401)
    response = RedirectResponse(f"{PREFIX}/", status_code=303)
    response.headers["set-cookie"] = cookie_header(sessions.open(), PREFIX)
    return response


async def _bounded_body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_LOGIN_BODY:
            break
    return body[:MAX_LOGIN_BODY]


def _login_page(message: str = "", status: int = 200) -> Response:
    """The login form: our own words only (escaped all the same), no script."""
    text = (STATIC / "login.html").read_text(encoding="utf-8")
    shown = f'<p class="error" role="alert">{html.escape(message)}</p>' if message else ""
    return Response(
        text.replace("<!--message-->", shown),
        status_code=status,
        media_type="text/html",
        headers={"cache-control": "no-store"},
    )
