"""The web view's ASGI app (Starlette, served by uvicorn): every path under `/ui`, behind the
gate of bridge/ui/security.py. `worker-bridge ui` serves it alone (see `serve`); the MCP HTTP
listener mounts the same app beside `/mcp` when config `http.ui` says so (bridge/mcp/http.py).

The pages are static shells (bridge/ui/static) whose scripts read the JSON API and the event
streams; nothing a worker wrote is ever put into HTML on the server.
"""

from __future__ import annotations

import html
import logging
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from bridge.listener.limits import ASGIApp, Message, Receive, RefusalLog, Scope, Send
from bridge.service import WorkerBridge
from bridge.ui import actions, routes, sse
from bridge.ui.routes import PREFIX, STATIC, read_body
from bridge.ui.security import SECURITY_HEADERS, HostPolicy, Sessions, origin_refusal

log = logging.getLogger("worker_bridge.ui")

MAX_LOGIN_BODY = 4096
SPENT_CODE = "That sign-in link was used already or has expired: sign in with the token."
REUSED_CODE = (
    "That sign-in link was used already, by another browser or program: the session it opened "
    "is ended now; sign in with the token."
)


class Gate:
    """Outermost layer: Host and Origin checks on everything and the security headers on every
    answer. A refusal is logged once per client and kind per interval (RefusalLog, as the MCP
    gate logs), so a client cannot grow the log at request speed."""

    def __init__(self, app: ASGIApp, hosts: HostPolicy, refusals: RefusalLog) -> None:
        self.app = app
        self.hosts = hosts
        self.refusals = refusals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = None
        if not self.hosts.allows(headers.get("host")):
            refusal = (421, "host", "This server does not answer for that host name.")
        else:
            action = scope["method"] not in ("GET", "HEAD")
            why = origin_refusal(headers, action=action)
            if why is not None:
                refusal = (403, "origin", f"Refused: {why}.")
        if refusal is not None:
            status, kind, text = refusal
            client = (scope.get("client") or ("?", 0))[0]
            self.refusals.warn(client, f"ui {kind}", f"ui: refused a request from {client}: {text}")
            response = JSONResponse({"error": text}, status_code=status)
            return await response(scope, receive, send_with_headers)
        await self.app(scope, receive, send_with_headers)


def build_app(bridge: WorkerBridge, sessions: Sessions, *, host: str) -> ASGIApp:
    """The web view for ``bridge`` on a listener at ``host``: its data needs one of
    ``sessions``, got with their token or a one-time code they issued (no token: `--no-token`,
    loopback only: the one shared session)."""
    refusals = RefusalLog()
    state = routes.UiState(bridge=bridge, sessions=sessions, refusals=refusals)

    async def login(request: Request) -> Response:
        return await _login(request, sessions, refusals)

    app = Starlette(
        routes=[
            Route(PREFIX, lambda r: RedirectResponse(f"{PREFIX}/", 303)),
            Route(f"{PREFIX}/login", login, methods=["GET", "POST"]),
            Mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="static"),
            *routes.page_routes(state),
            *sse.stream_routes(state),
            *actions.action_routes(state),
        ]
    )
    return Gate(app, HostPolicy(host), refusals)


async def _login(request: Request, sessions: Sessions, refusals: RefusalLog) -> Response:
    """GET: the login page (its script posts a one-time code given in the URL's fragment, or,
    under `--no-token`, signs in at once). POST of its form: the token, or a code, exchanged for
    a session, then a redirect to the list with the session's key in the fragment (no server,
    log or Referer sees a fragment; the page moves it into sessionStorage and out of the URL)."""
    if request.method != "POST":
        return _login_page(open_server=not sessions.needs_token)
    body = await read_body(request, MAX_LOGIN_BODY) or b""
    fields = parse_qs(body.decode("utf-8", "replace"))
    presented, code = ((fields.get(name) or [""])[0] for name in ("token", "code"))
    client = request.client.host if request.client else "?"
    if code:
        if not sessions.redeem_code(code):
            if sessions.revoke_spent(code):
                log.warning(
                    "ui: the sign-in link was used a second time (from %s): the session it "
                    "had opened is ended; sign in with the token",
                    client,
                )
                return _login_page(REUSED_CODE, status=401)
            refusals.warn(
                client, "ui code", f"ui: refused a login from {client}: a spent or unknown code"
            )
            return _login_page(SPENT_CODE, status=401)
    elif sessions.needs_token and not presented.strip():
        return _login_page("Give the token.", status=401)
    elif not sessions.token_matches(presented):
        refusals.warn(client, "ui login", f"ui: refused a login from {client}: wrong token")
        return _login_page("That is not this server's token.", status=401)
    session_id, session = sessions.open()
    if code:
        sessions.spent(code, session_id)
    response = RedirectResponse(f"{PREFIX}/#k={session.key}", status_code=303)
    response.headers["set-cookie"] = sessions.cookie_header(session_id)
    response.headers["cache-control"] = "no-store"
    return response


def _login_page(message: str = "", status: int = 200, *, open_server: bool = False) -> Response:
    """The login form: our own words only (escaped all the same), its one same-origin script."""
    text = (STATIC / "login.html").read_text(encoding="utf-8")
    shown = f'<p class="error" role="alert">{html.escape(message)}</p>' if message else ""
    text = text.replace("<!--message-->", shown)
    if open_server and not message:
        text = text.replace("<body>", '<body data-open="1">')
    return Response(
        text, status_code=status, media_type="text/html", headers={"cache-control": "no-store"}
    )
