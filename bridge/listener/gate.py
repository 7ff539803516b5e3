"""The token gate in front of every HTTP listener (ASGI): `GET /healthz` answered by the gate
itself, the web view under `/ui` passed to its own sign-in, anything else only with
`Authorization: Bearer <token>`, compared in constant time. A refusal is a 401 that says what to
send (in its body and its challenge's `error_description`; OAuth's discovery paths answer 404
with the same sentence, so a client that went looking for OAuth says why there is none), the
connection closed after it (without the token a client never holds more than one request head),
and a log line naming the client, the path and why (missing, malformed, wrong), never the token."""

from __future__ import annotations

import hmac
import json
import logging

from bridge.listener.flags import HEALTH_PATH
from bridge.listener.limits import (
    ASGIApp,
    Receive,
    RefusalLog,
    Scope,
    Send,
)
from bridge.version import __version__

log = logging.getLogger("worker_bridge.mcp.http")
# What a refused client is told: the token is a static one, nothing to discover or log in to.
STATIC_TOKEN = (
    "This server takes a static bearer token, not OAuth: send the header 'Authorization: "
    "Bearer <token>' with the token it was started with (its --token-file or "
    "$WORKER_BRIDGE_MCP_TOKEN)."
)
OAUTH_DISCOVERY = ("/.well-known/oauth-", "/.well-known/openid-configuration")


def token_matches(presented: bytes, token: bytes | None) -> bool:
    """The one comparison of a presented token with the server's (constant time); any
    presented value matches when the server has none (`--no-token`)."""
    return token is None or hmac.compare_digest(presented.strip(), token)


class BearerGate:
    """ASGI wrapper around the SDK app: answers GET /healthz itself and lets anything else
    through only with the right bearer token. Lifespan events pass straight through, so the
    SDK's session manager starts and stops with the server."""

    def __init__(self, app: ASGIApp, token: str | None, ui: ASGIApp | None = None) -> None:
        self.app = app
        self.ui = ui  # the web view (bridge/ui) under /ui: it signs in with the same token
        self._token = token.encode() if token is not None else None
        self._health = json.dumps({"ok": True, "version": __version__}).encode()
        self._refusals = RefusalLog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            return await self.app(scope, receive, send)
        if kind == "http" and scope["path"] == HEALTH_PATH and scope["method"] == "GET":
            return await _respond(send, 200, self._health)
        if kind == "http" and scope["path"].startswith(OAUTH_DISCOVERY):
            # A client that met a 401 looks for OAuth here: say there is none, and what to send.
            body = {"error": "no_oauth", "message": STATIC_TOKEN}
            return await _respond(send, 404, json.dumps(body).encode())
        if self.ui is not None and kind == "http" and _is_ui(scope["path"]):
            return await self.ui(scope, receive, send)
        refusal = self._refusal(scope)
        if refusal is None:
            return await self.app(scope, receive, send)
        client = scope.get("client")
        who = f"{client[0]}:{client[1]}" if client else "an unknown client"
        method = scope.get("method", kind.upper())
        if self._refusals.may_log(f"{client[0] if client else ''} ({refusal})"):
            path = _printable(str(scope.get("path", "")))
            log.warning("refused %s %s from %s: %s", _printable(method), path, who, refusal)
        if kind != "http":  # a websocket: nothing is served there, close before accepting
            return await send({"type": "websocket.close", "code": 1008})
        challenge = 'Bearer realm="worker-bridge"'
        if not refusal.startswith("missing"):
            challenge += ', error="invalid_token"'
        challenge += f', error_description="{STATIC_TOKEN}"'  # RFC 6750: what a client shows
        body = {"error": "unauthorized", "message": STATIC_TOKEN}
        # Closed after the answer: without the token a connection holds one head, never more.
        refused = [(b"www-authenticate", challenge), (b"connection", "close")]
        await _respond(send, 401, json.dumps(body).encode(), refused)

    def _refusal(self, scope: Scope) -> str | None:
        """Why the request is refused (words for the log, never the token), or None."""
        if self._token is None:
            return None
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if header is None:
            return "missing bearer token"
        scheme, _, presented = header.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not presented.strip():
            return "malformed Authorization header (not 'Bearer <token>')"
        if not token_matches(presented, self._token):
            return "wrong bearer token"
        return None


def _is_ui(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


def _printable(text: str, limit: int = 200) -> str:
    """What a client sent, fit for a log line: escapes for anything outside printable ASCII
    (no forged lines, no terminal escapes), and bounded."""
    shown = text.encode("ascii", "backslashreplace").decode("ascii")
    shown = "".join(c if 32 <= ord(c) < 127 else f"\\x{ord(c):02x}" for c in shown)
    return shown if len(shown) <= limit else shown[:limit] + f"...[{len(shown) - limit} more]"


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, str]] | None = None
) -> None:
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(name, value.encode()) for name, value in headers or []]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
