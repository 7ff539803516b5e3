"""Sending one request on to an upstream (a model provider, or an allowlisted host) with
aiohttp's client, streaming its body from the sandbox as it arrives and the answer back the same
way: neither is ever held whole, both are bounded in size and in time, and token usage (with the
model the upstream says answered) is read from the passing bytes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import h11

from bridge.config.settings import GatewayConfig
from bridge.events import Destination
from bridge.gateway.accounting import Accounting
from bridge.gateway.exchange import Exchange, Refused
from bridge.gateway.usage import JsonEnds, TokenCounter

_DROP_BACK = {b"connection", b"keep-alive", b"transfer-encoding", b"proxy-connection"}
# The client's read buffer per answer (aiohttp pauses the upstream past twice this): small, as
# each exchange's share of the gateway's byte budget covers it (exchange.EXCHANGE_BYTES).
READ_BUFSIZE = 2**15


class _SandboxGone(Exception):
    """The sandbox hung up, or stopped reading for longer than the idle timeout."""


async def _give(exchange: Exchange, *events: object) -> None:
    try:
        await exchange.send(*events)
    except (ConnectionError, TimeoutError, OSError) as exc:
        raise _SandboxGone() from exc


@dataclass
class Outgoing:
    method: str
    url: str
    headers: list[tuple[str, str]]
    body: AsyncIterator[bytes] | None  # the sandbox's body as it arrives; None: no body
    where: Destination  # route or host, for the event
    count_tokens: bool = False


class _Body:
    """The request body on its way out: counted, and a refusal met while reading it (too large,
    malformed, too slow) kept, since the HTTP client reports a failing body only as its own
    error."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks
        self.sent = 0
        self.refusal: Refused | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.chunks:
                self.sent += len(chunk)
                yield chunk
        except Refused as exc:
            self.refusal = exc
            raise


def _final(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A key refused on a route is the host's key: no retry from the sandbox can fix it, and
    each one would send the real key out again. `x-should-retry: false` (honoured by the
    Anthropic and OpenAI SDKs, so by Claude Code, which otherwise retries a 401 ten times over
    three minutes) tells the CLI so."""
    kept = [(k, v) for k, v in headers if k.lower() != b"x-should-retry"]
    return [*kept, (b"x-should-retry", b"false")]


async def stream(
    session: aiohttp.ClientSession,
    exchange: Exchange,
    out: Outgoing,
    config: GatewayConfig,
    accounts: Accounting,
) -> bool:
    """Relay ``out`` and its answer; True when the connection may serve another request.
    Refused when nothing was answered yet: the refusal met while reading the sandbox's body
    (too large, malformed, too slow), or 502/504 when the upstream failed (the sandbox is told
    why)."""
    started = time.monotonic()
    counter = TokenCounter() if out.count_tokens else None
    body = _Body(out.body) if out.body is not None else None
    status, down, note, answered = 0, 0, None, False
    timeout = aiohttp.ClientTimeout(
        total=config.total_timeout_s,
        sock_connect=config.connect_timeout_s,
        sock_read=config.idle_timeout_s,
    )
    try:
        async with session.request(
            out.method,
            out.url,
            headers=out.headers,
            data=body.__aiter__() if body is not None else None,
            timeout=timeout,
            allow_redirects=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        ) as response:
            status = response.status
            headers = [(k, v) for k, v in response.raw_headers if k.lower() not in _DROP_BACK]
            if "route" in out.where and status in (401, 403):
                headers = _final(headers)
            await _give(exchange, h11.Response(status_code=status, headers=headers))
            answered = True
            kind = response.headers.get("content-type", "")
            streaming = "text/event-stream" in kind
            ends = JsonEnds() if counter is not None and "json" in kind else None
            limit = config.max_response_mb * 2**20
            async for chunk in response.content.iter_any():
                down += len(chunk)
                if down > limit:
                    note = f"response over {config.max_response_mb} MB (gateway.max_response_mb)"
                    break
                await _give(exchange, h11.Data(data=chunk))
                if counter is not None and streaming:
                    counter.feed_event_stream(chunk)
                elif ends is not None:
                    ends.feed(chunk)
            if note is None and body is not None and body.refusal is not None:
                note = body.refusal.reason  # answered early, then the body went wrong
            if note is None:
                await _give(exchange, h11.EndOfMessage())
            if ends is not None and counter is not None:
                ends.read_into(counter)
    except _SandboxGone:
        note = "the sandbox hung up or stopped reading"
    except (TimeoutError, aiohttp.ClientError, Refused, OSError) as exc:
        up = body.sent if body is not None else 0
        refusal = body.refusal if body is not None else None
        if refusal is None and isinstance(exc, Refused):
            raise
        if refusal is not None:
            answer, note = refusal.status, refusal.reason
        elif isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
            answer, note = 504, "upstream too slow (gateway timeouts)"
        else:
            answer, note = 502, f"upstream unreachable or failing ({exc.__class__.__name__})"
        if not answered:
            accounts.request(out.where, out.method, answer, up, down, started, counter, note)
            raise (refusal or Refused(answer, f"gateway: {note}")) from exc
    up = body.sent if body is not None else 0
    accounts.request(out.where, out.method, status, up, down, started, counter, note)
    return note is None
