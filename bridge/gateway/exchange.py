"""One HTTP/1.1 connection from the sandbox, parsed with h11 (a well-kept sans-I/O HTTP/1.1
implementation: keep-alive, chunked bodies, CONNECT), with the gateway's bounds on waiting and on
sizes, and one-line answers for what it refuses.

A request's body is never held whole: `body_chunks` hands it on as it arrives, a read at a time,
and the connection reads only while it holds its share of the gateway's byte budget (taken when
a request starts to arrive, given back when its answer is sent)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

import h11

from bridge.gateway.budget import ByteBudget
from bridge.gateway.conn import Conn

READ = 65536
# What one exchange through an upstream may hold at once: the sandbox's read and what h11 has
# buffered of it (a head is at most 64 KiB), the HTTP client's own buffers for the request it
# writes and the answer it reads (read_bufsize, and the event loop's reads of 256 KiB), and
# what token counting keeps of the answer (usage.py: 64 KiB of an event line, or 128 KiB of
# a JSON answer's ends).
EXCHANGE_BYTES = 768 * 1024
# Headers that belong to one connection, never forwarded (Host and Content-Length are set anew).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)


class Refused(Exception):
    """Answered with ``status`` and a one-line ``reason`` (the sandbox sees why)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def shown(text: str, limit: int = 200) -> str:
    """Sandbox-chosen text as it goes into an event or an answer: bounded."""
    return text if len(text) <= limit else text[:limit] + "..."


class Exchange:
    """``idle_timeout`` bounds each wait to read or to write; ``read_deadline`` bounds the time
    spent waiting for a request's head and body to arrive, in all (a slow drip). Only waits for
    the sandbox count: while the gateway itself is not reading (its upstream taking the body
    slowly, the host busy), a large body arriving as fast as it is taken is not "too slow"."""

    def __init__(
        self,
        conn: Conn,
        budget: ByteBudget,
        idle_timeout: float,
        read_deadline: float = 60.0,
    ) -> None:
        self.sock = conn
        self.budget = budget
        self.idle_timeout = idle_timeout
        self.read_deadline = read_deadline
        self._waited = 0.0  # seconds this request has waited for the sandbox's bytes
        self._pending: Any = None
        self._held = 0
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)

    # -- the budget ------------------------------------------------------------------------

    async def begin(self) -> bool:
        """Wait (up to the idle timeout) for the next request to start arriving, then take this
        exchange's share of the budget. False when the connection ended or stayed silent."""
        event = self.conn.next_event()
        if event is h11.NEED_DATA:
            try:
                await self.sock.readable(self.idle_timeout)
            except TimeoutError:
                return False
        else:
            self._pending = event  # pipelined behind the last request, already parsed
        self._held = await self.budget.take(EXCHANGE_BYTES)
        return True

    def release(self) -> None:
        """Give the exchange's share back (idempotent): when its answer is sent, or before a
        tunnel, which takes its own per read."""
        if self._held:
            self.budget.give(self._held)
            self._held = 0

    # -- reading ---------------------------------------------------------------------------

    def _wait(self) -> float:
        left = self.read_deadline - self._waited
        if left <= 0:
            raise Refused(408, "the request took too long to arrive")
        return min(self.idle_timeout, left)

    def request_done(self) -> None:
        """The request is read: the next one gets its own deadline."""
        self._waited = 0.0

    async def next(self) -> Any:
        """The next h11 event, reading as needed (each read bounded by the idle timeout and
        the request's read deadline)."""
        if self._pending is not None:
            event, self._pending = self._pending, None
            return event
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                data = await self.sock.recv(READ, self._wait())
            except TimeoutError:
                self._waited += loop.time() - started
                self._wait()  # Refused(408) when it was the request's deadline that passed
                raise
            self._waited += loop.time() - started
            self.conn.receive_data(data)

    async def body_chunks(self, limit: int) -> AsyncIterator[bytes]:
        """The request's body as it arrives, or Refused(413) past ``limit`` bytes in all."""
        seen = 0
        while True:
            event = await self.next()
            if isinstance(event, h11.Data):
                seen += len(event.data)
                if seen > limit:
                    raise Refused(
                        413, f"request body over {limit // 2**20} MB (gateway.max_request_mb)"
                    )
                yield event.data
            elif isinstance(event, h11.EndOfMessage):
                self.request_done()
                return
            else:
                raise Refused(400, "incomplete request body")

    async def body_or_none(self, request: h11.Request, limit: int) -> AsyncIterator[bytes] | None:
        """The request's body to stream on (`body_chunks`), or None when it has none (its end
        is read here, so the connection may carry the next request)."""
        chunked = any(
            k.lower() == b"transfer-encoding" and b"chunked" in v.lower()
            for k, v in request.headers
        )
        if chunked or content_length(request):
            return self.body_chunks(limit)
        async for _ in self.body_chunks(limit):
            pass  # no bytes: only the end of the message
        return None

    # -- writing ---------------------------------------------------------------------------

    async def send(self, *events: Any) -> None:
        # A sandbox that stops reading cannot hold the gateway (or its upstream) forever.
        for event in events:
            await self.sock.sendall(self.conn.send(event) or b"", self.idle_timeout)

    async def answer(self, status: int, text: str) -> None:
        """A one-line plain-text answer, when the exchange still allows one."""
        body = (text.rstrip(".") + ".\n").encode()
        headers = [
            ("content-type", "text/plain; charset=utf-8"),
            ("content-length", str(len(body))),
            ("x-worker-bridge", "gateway"),
        ]
        try:
            await self.send(
                h11.Response(status_code=status, headers=headers, reason=_phrase(status)),
                h11.Data(data=body),
                h11.EndOfMessage(),
            )
        except (h11.LocalProtocolError, ConnectionError, TimeoutError, OSError):
            pass

    async def linger(self, seconds: float = 2.0, limit: int = 64 * 2**20) -> None:
        """Close gently after answering early (a 413 before the body was read): stop writing,
        and read and drop what the client is still sending for a moment, so that closing does
        not reset the connection and lose the answer."""
        try:
            self.sock.end_writing()
            loop = asyncio.get_running_loop()
            until, seen = loop.time() + seconds, 0
            while seen < limit and loop.time() < until:
                data = await self.sock.recv(READ, until - loop.time())
                if not data:
                    break
                seen += len(data)
        except (TimeoutError, ConnectionError, OSError):
            pass

    @property
    def reusable(self) -> bool:
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE


def _phrase(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def content_length(request: h11.Request) -> int | None:
    for key, value in request.headers:
        if key.lower() == b"content-length" and value.isdigit():
            return int(value)
    return None
