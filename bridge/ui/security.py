"""What stands between a browser and the verbs that change a user's working tree.

- The token (bridge/mcp_http.py's, from the same token file) is presented once, at
  `/ui/login`, and exchanged for a session: a random id in an HttpOnly, SameSite=Strict cookie
  (never the token itself) and a CSRF token of its own that the page reads from
  `/ui/api/session` and sends in a header with every action. With `--no-token` (loopback only)
  a session is handed to whoever asks, but actions still need its CSRF token.
- Host and Origin: on a loopback listener only a loopback Host is served (a page whose name was
  rebound to 127.0.0.1 gets nothing), a request from a foreign Origin or a cross-site fetch is
  refused, and an action must come from the page's own Origin.
- Every answer carries a strict Content-Security-Policy (no inline script, no eval), nosniff,
  no framing and no referrer sent to other sites.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from bridge.mcp_http import is_loopback

SESSION_COOKIE = "wb_ui_session"
CSRF_HEADER = "x-csrf-token"
SESSION_TTL_S = 12 * 3600
MAX_SESSIONS = 256  # the oldest is dropped past this: logging in again and again grows nothing

CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make a form's Origin "null"
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


@dataclass
class Session:
    csrf: str
    expires: float


class Sessions:
    """The live sessions of one server, in memory (a restart logs everyone out)."""

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token is not None else None
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    @property
    def needs_token(self) -> bool:
        return self._token is not None

    def token_matches(self, presented: str) -> bool:
        if self._token is None:
            return True
        return hmac.compare_digest(presented.strip().encode(), self._token)

    def open(self) -> str:
        """A new session; its id (the cookie's value)."""
        session_id = secrets.token_urlsafe(32)
        self._sessions[session_id] = Session(secrets.token_urlsafe(32), time.time() + SESSION_TTL_S)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session_id

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None or session.expires < time.time():
            self._sessions.pop(session_id, None)
            return None
        return session

    def close(self, session_id: str | None) -> None:
        self._sessions.pop(session_id or "", None)

    def csrf_ok(self, session_id: str | None, presented: str | None) -> bool:
        session = self.get(session_id)
        if session is None or not presented:
            return False
        return hmac.compare_digest(presented.encode(), session.csrf.encode())


def cookie_header(session_id: str, path: str) -> str:
    return (
        f"{SESSION_COOKIE}={session_id}; Path={path}; HttpOnly; SameSite=Strict; "
        f"Max-Age={SESSION_TTL_S}"
    )


def expired_cookie_header(path: str) -> str:
    return f"{SESSION_COOKIE}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0"


class HostPolicy:
    """Which Host headers this listener answers: on a loopback address only loopback names
    (DNS rebinding), on a named address that name, on a wildcard address any (the token is the
    protection there, as for the MCP listener)."""

    def __init__(self, bind_host: str) -> None:
        self.bind_host = bind_host
        if is_loopback(bind_host):
            self._names: set[str] | None = {"127.0.0.1", "localhost", "::1", bind_host}
        elif bind_host in ("0.0.0.0", "::"):
            self._names = None
        else:
            self._names = {bind_host.lower()}

    def allows(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        name = _host_name(host_header)
        if name is None:
            return False
        return self._names is None or name in self._names


def _host_name(host_header: str) -> str | None:
    """The name in a Host header (`name`, `name:port`, `[v6]:port`), lowercased, or None when
    it is not one."""
    text = host_header.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (text[end + 1 :] and not text[end + 1 :].lstrip(":").isdigit()):
            return None
        return text[1:end]
    name, _, port = text.partition(":")
    if port and not port.isdigit():
        return None
    return name or None


def origin_refusal(headers: dict[str, str], *, action: bool) -> str | None:
    """Why a request is refused for where it comes from, or None: a foreign Origin, a
    cross-site fetch, and for an action no Origin at all (a browser always sends one there)."""
    host = headers.get("host", "")
    origin = headers.get("origin")
    if origin is not None and origin != f"http://{host}" and origin != f"https://{host}":
        return "the request comes from another origin"
    if headers.get("sec-fetch-site") == "cross-site":
        return "the request was made by another site"
    if action and origin is None:
        return "an action must come from this page (no Origin header)"
    return None
