"""Sending one request on to an upstream (a model provider, or an allowlisted host) with
aiohttp's client and streaming the answer back as it arrives: never buffered whole, bounded in
size and in time, with token usage read from the passing bytes."""

from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp
import h11

from bridge.config import GatewayConfig
from bridge.gateway.accounting import Accounting
from bridge.gateway.exchange import Exchange, Refused
from bridge.gateway.usage import TokenCounter

_DROP_BACK = {b"connection", b"keep-alive", b"transfer-encoding", b"proxy-connection"}
_JSON_LIMIT = 8 * 2**20  # how much of a JSON answer is kept to read its token usage


class _SandboxGone(Exception):
    """The sandbox hung up, or stopped reading for longer than the idle timeout."""


async def _give(exchange: Exchange, *events: object) -> None:
    try:
        await exchange.send(*events)
    except (ConnectionError, TimeoutError) as exc:
        raise _SandboxGone() from exc


@dataclass
class Outgoing:
    method: str
    url: str
    headers: list[tuple[str, str]]
    body: bytes
    where: dict  # route or host, for the event
    model: str | None = None
    count_tokens: bool = False


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
    Refused(502/504) when the upstream fails before answering (the sandbox is told why)."""
    started = time.monotonic()
    counter = TokenCounter() if out.count_tokens else None
    status, down, note = 0, 0, None
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
            data=out.body or None,
            timeout=timeout,
            allow_redirects=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        ) as response:
            status = response.status
            headers = [(k, v) for k, v in response.raw_headers if k.lower() not in _DROP_BACK]
            if "route" in out.where and status in (401, 403):
                headers = _final(headers)
            await _give(exchange, h11.Response(status_code=status, headers=headers))
            streaming = "text/event-stream" in response.headers.get("content-type", "")
            kept = bytearray()
            limit = config.max_response_mb * 2**20
            async for chunk in response.content.iter_any():
                down += len(chunk)
                if down > limit:
                    note = f"response over {config.max_response_mb} MB (gateway.max_response_mb)"
                    break
                await _give(exchange, h11.Data(data=chunk))
                if counter is not None:
                    if streaming:
                        counter.feed_event_stream(chunk)
                    elif len(kept) < _JSON_LIMIT:
                        kept += chunk
            if note is None:
                await _give(exchange, h11.EndOfMessage())
            if counter is not None and kept:
                counter.feed_json(bytes(kept))
    except _SandboxGone:
        note = "the sandbox hung up or stopped reading"
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        note = "upstream too slow (gateway timeouts)"
        _fail(accounts, out, started, down, counter, note, status, 504, exc)
    except aiohttp.ClientError as exc:
        note = f"upstream unreachable or failing ({exc.__class__.__name__})"
        _fail(accounts, out, started, down, counter, note, status, 502, exc)
    accounts.request(
        out.where, out.method, status, len(out.body), down, started, out.model, counter, note
    )
    return note is None


def _fail(
    accounts: Accounting,
    out: Outgoing,
    started: float,
    down: int,
    counter: TokenCounter | None,
    note: str,
    status: int,
    answer: int,
    exc: Exception,
) -> None:
    """Before the upstream answered, the sandbox gets ``answer`` with the reason."""
    if status == 0:
        accounts.request(
            out.where, out.method, answer, len(out.body), down, started, out.model, counter, note
        )
        raise Refused(answer, f"gateway: {note}") from exc
