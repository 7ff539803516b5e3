"""What the MCP server's HTTP listener sheds (config `http`, docs/security.md): a deadline for each
request's head and for its body, caps on connections per client address and in total, a bound on
a request's body, and the refusal of an MCP session past `http.max_sessions` in one sentence.

The deadlines and caps live in the connection's protocol (uvicorn's h11 protocol, subclassed),
below the token gate, so they hold for clients without the token: a connection past a cap is
answered 503 and closed before a byte of it is read, and one that is slow to send its head or
body is answered 408 and closed. The sessions themselves are the SDK's to count and reap
(`max_sessions`, `session_idle_timeout`); this module only words its refusal.

No `mcp` import here (that stays in bridge/mcp).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, cast

import h11
from uvicorn.config import Config as UvicornConfig
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr
from uvicorn.server import ServerState

from bridge.config.settings import HttpConfig

log = logging.getLogger("worker_bridge.mcp.http")

REFUSAL_LOG_INTERVAL_S = 10.0  # one refusal line per client address and kind per interval
REFUSAL_LOG_KEYS = 10_000  # the refusal log's memory is bounded too
SESSION_HEADER = b"mcp-session-id"
SDK_SESSION_CAP_MESSAGE = b"Too many open sessions"  # the SDK's words for its 503

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RefusalLog:
    """One log line per client and kind of refusal per interval, then a count of the rest: a
    client without the token cannot grow the log (and the disk under the state root) at
    request speed."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, int]] = {}

    def may_log(self, key: str) -> bool:
        now = time.monotonic()
        last, skipped = self._seen.get(key, (0.0, 0))
        if now - last < REFUSAL_LOG_INTERVAL_S:
            self._seen[key] = (last, skipped + 1)
            return False
        if skipped:
            log.warning("refused %d more requests from %s, not logged one by one", skipped, key)
        if len(self._seen) > REFUSAL_LOG_KEYS:
            self._seen.clear()
        self._seen[key] = (now, 0)
        return True

    def warn(self, client: str, kind: str, text: str) -> None:
        if self.may_log(f"{client} ({kind})"):
            log.warning("%s", text)


def client_key(host: str) -> str:
    """The address a connection is counted against: the IPv4 address (also when mapped into
    IPv6), or an IPv6 client's /64, which one subscriber usually holds whole."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass
class ConnectionLedger:
    """Connections open now, per client address and in total (one event loop: no lock)."""

    max_total: int
    max_per_client: int
    total: int = 0
    per_client: dict[str, int] = field(default_factory=dict)

    def admit(self, client: str) -> str | None:
        """Count the connection in, or say in one sentence why it is refused."""
        if self.total >= self.max_total:
            return (
                f"This server already has its limit of {self.max_total} connections open "
                "(http.max_connections); retry in a few seconds."
            )
        if self.per_client.get(client, 0) >= self.max_per_client:
            return (
                f"This client address already has {self.max_per_client} connections open to "
                "this server (http.max_connections_per_client); close some or reuse them."
            )
        self.total += 1
        self.per_client[client] = self.per_client.get(client, 0) + 1
        return None

    def release(self, client: str) -> None:
        self.total -= 1
        left = self.per_client.get(client, 1) - 1
        if left > 0:
            self.per_client[client] = left
        else:
            self.per_client.pop(client, None)


@dataclass
class Shedding:
    """What every connection of one listener shares: the bounds, the ledger, the refusal log."""

    limits: HttpConfig
    ledger: ConnectionLedger
    refusals: RefusalLog

    @classmethod
    def of(cls, limits: HttpConfig) -> Shedding:
        ledger = ConnectionLedger(limits.max_connections, limits.max_connections_per_client)
        return cls(limits, ledger, RefusalLog())


def describe_bounds(limits: HttpConfig) -> str:
    """The bounds in one line, for the server's start-up log."""
    return (
        f"head {limits.head_timeout_s:g} s, body {limits.body_timeout_s:g} s and "
        f"{limits.max_body_kb} KiB, {limits.max_connections} connections "
        f"({limits.max_connections_per_client} per client), {limits.max_sessions} sessions "
        f"(idle {limits.session_idle_timeout_s:g} s)"
    )


def protocol_factory(limits: HttpConfig) -> Callable[..., asyncio.Protocol]:
    """What uvicorn.Config(http=...) is given: our protocol, bound to one listener's state."""
    return functools.partial(SheddingH11Protocol, shed=Shedding.of(limits))


def uvicorn_options(limits: HttpConfig) -> dict[str, Any]:
    """uvicorn.Config settings for the listener's bounds."""
    return {
        "http": protocol_factory(limits),
        "ws": "none",  # nothing is served over websockets: an upgrade is a plain request
        "timeout_keep_alive": limits.keep_alive_s,
        "h11_max_incomplete_event_size": limits.max_head_kb * 1024,
    }


class ClientWarnings:
    """uvicorn's per-connection logger, with its warnings (a malformed request, an upgrade
    asked for) logged once per client and kind per interval: each is a client's doing, one
    per request, so a client could otherwise grow the log at request speed. Everything else
    (errors of the app) goes to uvicorn's logger as before."""

    def __init__(self, logger: logging.Logger, refusals: RefusalLog, client: str) -> None:
        self._logger = logger
        self._refusals = refusals
        self._client = client

    def warning(self, msg: str, *args: Any, **_: Any) -> None:
        text = msg % args if args else msg
        self._refusals.warn(self._client, text[:40], f"{text} (from {self._client})")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


class SheddingH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the caps checked at connect and a deadline on whatever the
    client still owes: the head (from connecting, or from the previous response) and then the
    body. While the server is answering, or the client waits on a stream, no deadline runs."""

    def __init__(
        self,
        config: UvicornConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        shed: Shedding,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._shed = shed
        self._client = "unknown"
        self._admitted = False
        self._owed: str | None = None  # "head", "body" or None
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport  # connection_lost needs it, refused or not
        peer = get_remote_addr(transport)
        self._client = client_key(peer[0]) if peer else "unknown"
        # Duck-typed: uvicorn only calls its connection logger's methods.
        warnings = ClientWarnings(self.logger, self._shed.refusals, self._client)
        self.logger = cast(logging.Logger, warnings)
        refusal = self._shed.ledger.admit(self._client)
        if refusal is not None:
            self._shed.refusals.warn(
                self._client, "cap", f"refused a connection from {self._client}: {refusal}"
            )
            transport.write(_response(503, "too_many_connections", refusal))
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return  # never counted, nothing of it started
        self._admitted = False
        self._shed.ledger.release(self._client)
        self._set_deadline(None)
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._admitted and not self.transport.is_closing():
            self._watch()

    def _watch(self) -> None:
        """Arm the deadline for what the client owes now, when that changed."""
        state = self.conn.their_state
        owed = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if owed != self._owed:
            self._set_deadline(owed)

    def _timeout(self, owed: str) -> float:
        limits = self._shed.limits
        return limits.head_timeout_s if owed == "head" else limits.body_timeout_s

    def _set_deadline(self, owed: str | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._owed = owed
        if owed is not None:
            self._deadline = self.loop.call_later(self._timeout(owed), self._deadline_passed, owed)

    def _deadline_passed(self, owed: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        message = (
            f"The request's {owed} was not sent within {self._timeout(owed):g} s "
            f"(http.{owed}_timeout_s); send each request whole and at once."
        )
        self._shed.refusals.warn(
            self._client, owed, f"closed a connection from {self._client}: {message}"
        )
        cycle = self.cycle
        if owed == "head" or (cycle is not None and not cycle.response_started):
            if cycle is not None:
                cycle.disconnected = True  # the app's own answer, if any, goes nowhere now
            self.transport.write(_response(408, "request_timeout", message))
        self.transport.close()


def _response(status: int, error: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, written before (or instead of)
    anything the app would say."""
    body = json.dumps({"error": error, "message": message}).encode()
    reason = {408: "Request Timeout", 503: "Service Unavailable"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class WholeBody:
    """ASGI wrapper behind the token gate, in front of the SDK: a request's body is read whole,
    up to `http.max_body_kb`, before the SDK sees the request. The SDK's own body limit passes a
    request whose client went away mid-body on to the session manager, which then admits a
    session for it and logs a traceback; here such a request (cut at the body deadline) ends
    quietly, and a session is only ever admitted for a request that fully arrived."""

    def __init__(self, app: ASGIApp, limits: HttpConfig) -> None:
        self.app = app
        self._max = limits.max_body_kb * 1024
        self._too_large = _json_answer(
            413,
            "request_too_large",
            f"The request body is over {limits.max_body_kb} KiB (http.max_body_kb); "
            "send less in one request.",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"0")
        if declared.isdigit() and int(declared) > self._max:
            return await _send_all(send, self._too_large)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # gone before its body arrived: nothing to answer, nothing to admit
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max:
                return await _send_all(send, self._too_large)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole: Message | None = {"type": "http.request", "body": b"".join(chunks)}

        async def replay() -> Message:
            nonlocal whole
            if whole is None:
                return await receive()  # later calls wait for the disconnect, as before
            message, whole = whole, None
            return message

        await self.app(scope, replay, send)


def _json_answer(status: int, error: str, message: str) -> list[Message]:
    """The ASGI messages of a JSON answer that closes the connection."""
    body = json.dumps({"error": error, "message": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    start = {"type": "http.response.start", "status": status, "headers": headers}
    return [start, {"type": "http.response.body", "body": body}]


async def _send_all(send: Send, messages: list[Message]) -> None:
    for message in messages:
        await send(message)


class SessionCapNotice:
    """ASGI wrapper around the SDK app: its refusal of a new session past `max_sessions` (503,
    'Too many open sessions') says which limit it is, how long idle sessions live and what to
    do, with a Retry-After. Requests on an open session pass untouched."""

    def __init__(self, app: ASGIApp, limits: HttpConfig) -> None:
        self.app = app
        idle = limits.session_idle_timeout_s
        self._retry_after = str(max(1, min(60, int(idle))))
        self._message = (
            f"This server already has its limit of {limits.max_sessions} MCP sessions open "
            f"(http.max_sessions); end a session you no longer use (DELETE with its "
            f"Mcp-Session-Id), or retry once idle ones close (after "
            f"http.session_idle_timeout_s, {idle:g} s)."
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or any(k == SESSION_HEADER for k, _ in scope["headers"]):
            return await self.app(scope, receive, send)
        held: Message | None = None

        async def reword(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] == 503:
                held = message  # wait for the body to tell whether it is the session cap
                return
            if held is not None and message["type"] == "http.response.body":
                start, held = held, None
                body = message.get("body", b"")
                if SDK_SESSION_CAP_MESSAGE in body and not message.get("more_body", False):
                    return await self._refuse(send, body)
                await send(start)
            await send(message)

        await self.app(scope, receive, reword)

    async def _refuse(self, send: Send, sdk_body: bytes) -> None:
        try:
            error = json.loads(sdk_body)
            error["error"]["message"] = self._message
        except (ValueError, KeyError, TypeError):
            error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32603}}
            error["error"]["message"] = self._message
        body = json.dumps(error).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", self._retry_after.encode()),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
