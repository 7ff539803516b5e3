"""What stands between a browser and the verbs that change a user's working tree.

- The token (bridge/mcp/http.py's, from the same token file) is presented once, by POST to
  `/ui/login` (the login page's form; never in a URL), or instead a one-time code from the link
  `worker-bridge ui` prints (`/ui/login#code=...`: a browser opened with it keeps it in its
  argv and history, so it makes one session, within CODE_TTL_S, and is void after), and
  exchanged for a session of two halves: a random id in an HttpOnly,
  SameSite=Strict cookie named for the port (`wb_ui_<port>`), and a random key the browser
  gets once in the fragment of the redirect (`/ui/#k=...`). The page moves the key into
  sessionStorage (its origin's, port included) and sends it as `X-UI-Key` with every read,
  stream and action. Cookies are not isolated by port, so a page on another loopback port
  may hold the cookie; it never has the key, and nothing hands the key out for a cookie.
- With `--no-token` (loopback only) every login gets the one shared session: signing in
  again and again evicts nobody.
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
from collections.abc import Callable
from dataclasses import dataclass

from bridge.listener.gate import token_matches
from bridge.listener.options import LOOPBACK_NAMES, is_loopback

KEY_HEADER = "x-ui-key"
SESSION_TTL_S = 12 * 3600
CODE_TTL_S = 300  # a printed sign-in link is opened when printed, or never
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
    key: str  # what the page sends in X-UI-Key: never in a cookie, never handed out again
    expires: float


class Sessions:
    """The live sessions of one server, in memory (a restart logs everyone out)."""

    def __init__(
        self, token: str | None, port: int, clock: Callable[[], float] = time.time
    ) -> None:
        self._token = token.encode() if token is not None else None
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._codes: dict[str, float] = {}  # one-time sign-in codes -> when each expires
        # used codes -> the session each opened, and until when a second use ends that session
        self._spent: dict[str, tuple[str, float]] = {}
        self._clock = clock
        self.cookie = f"wb_ui_{port}"  # `ui` and `mcp --http` on one host keep their own

    @property
    def needs_token(self) -> bool:
        return self._token is not None

    def token_matches(self, presented: str) -> bool:
        return token_matches(presented.encode(), self._token)

    def issue_code(self) -> str:
        """A new one-time sign-in code (for the link `worker-bridge ui` prints)."""
        code = secrets.token_urlsafe(32)
        self._codes[code] = self._clock() + CODE_TTL_S
        return code

    def redeem_code(self, presented: str) -> bool:
        """Whether ``presented`` is a live code; the code is void from then on, used or not."""
        now = self._clock()
        found = None
        for code, expires in list(self._codes.items()):  # every one compared, in constant time
            if expires < now:
                del self._codes[code]
            elif hmac.compare_digest(presented.encode(), code.encode()):
                found = code
        return found is not None and self._codes.pop(found, None) is not None

    def spent(self, code: str, session_id: str) -> None:
        """``code`` opened ``session_id``: presented again (within CODE_TTL_S), it ends it."""
        self._spent[code] = (session_id, self._clock() + CODE_TTL_S)

    def revoke_spent(self, presented: str) -> bool:
        """Whether ``presented`` is a code used already; if so, the session it opened is ended.
        Whoever read the link in a browser's argv and raced the browser to it gets a session
        only until the browser presents the link in its turn."""
        now = self._clock()
        found = None
        for code, (_, expires) in list(self._spent.items()):  # all compared, in constant time
            if expires < now:
                del self._spent[code]
            elif hmac.compare_digest(presented.encode(), code.encode()):
                found = code
        if found is None:
            return False
        session_id, _ = self._spent.pop(found)
        self._sessions.pop(session_id, None)
        return True

    def open(self) -> tuple[str, Session]:
        """A session for a login: a new one (its id is the cookie's value), or under
        `--no-token` the one shared session."""
        if self._token is None:
            for session_id in list(self._sessions):
                if (shared := self._live(session_id)) is not None:
                    return session_id, shared
        session_id = secrets.token_urlsafe(32)
        session = Session(secrets.token_urlsafe(32), self._clock() + SESSION_TTL_S)
        self._sessions[session_id] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session_id, session

    def _live(self, session_id: str | None) -> Session | None:
        session = self._sessions.get(session_id or "")
        if session is not None and session.expires < self._clock():
            self._sessions.pop(session_id or "", None)
            return None
        return session

    def is_live(self, session_id: str | None) -> bool:
        """Whether the session is still open (not signed out, evicted or expired)."""
        return self._live(session_id) is not None

    def has_cookie(self, cookies: dict[str, str]) -> bool:
        """A live session's cookie: enough for a page shell (static, no data), nothing else."""
        return self._live(cookies.get(self.cookie)) is not None

    def authorized(self, cookies: dict[str, str], presented_key: str | None) -> str | None:
        """The session id when both halves are there (the cookie and its key), else None."""
        session_id = cookies.get(self.cookie)
        session = self._live(session_id)
        if session is None or not presented_key:
            return None
        if not hmac.compare_digest(presented_key.encode(), session.key.encode()):
            return None
        return session_id

    def close(self, session_id: str | None) -> None:
        self._sessions.pop(session_id or "", None)

    def cookie_header(self, session_id: str) -> str:
        return (
            f"{self.cookie}={session_id}; Path=/ui; HttpOnly; SameSite=Strict; "
            f"Max-Age={SESSION_TTL_S}"
        )

    def expired_cookie_header(self) -> str:
        return f"{self.cookie}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"


class HostPolicy:
    """Which Host headers this listener answers: on a loopback address only loopback names
    (DNS rebinding), on a named address that name, on a wildcard address any (the token is the
    protection there, as for the MCP listener)."""

    def __init__(self, bind_host: str) -> None:
        self.bind_host = bind_host
        if is_loopback(bind_host):
            self._names: set[str] | None = {*LOOPBACK_NAMES, bind_host}
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
