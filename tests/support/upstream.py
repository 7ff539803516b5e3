"""A small HTTP upstream the gateway tests start on the host's loopback (no provider is reachable
from here): it records every request with the headers it got, answers JSON with token usage and
the model it says served (`served-<the model asked for>`, so a test can tell the two apart),
streams server-sent events slowly, can be slow to answer, sends large bodies, and counts a body
it discards unread (`/discard`, for floods; `/slow-discard` taking it slowly)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from dataclasses import dataclass, field

from aiohttp import web

from bridge.smoke.loopback import LoopbackServer


def _digest(value: str | None) -> str | None:
    return hashlib.sha256(value.encode()).hexdigest() if value else None


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Upstream(LoopbackServer):
    port: int = 0
    requests: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # ends /held streams
    discarded: int = 0  # bytes of /discard bodies

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/slow-discard"):  # a sink that takes its body slowly
            seen = 0
            while chunk := await request.content.read(64 * 1024):
                seen += len(chunk)
                await asyncio.sleep(0.05)
            self.discarded += seen
            return web.json_response({"received": seen})
        if request.path.endswith("/discard"):  # streamed through and dropped: a flood's sink
            seen = 0
            async for chunk in request.content.iter_any():
                seen += len(chunk)
            self.discarded += seen
            return web.json_response({"received": seen})
        body = await request.read()
        served = "served-" + _asked_model(body)
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append(Seen(request.method, request.path_qs, headers, body))
        path = request.path
        if path.endswith("/sse"):
            return await self._sse(request, served, delay=0.0)
        if path.endswith("/slow-sse"):
            return await self._sse(request, served, delay=0.4)
        if path.endswith("/held"):  # one chunk, then waits for release (or 60 s)
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"data: first\n\n")
            await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 60)
            await response.write(b"data: last\n\n")
            return response
        if path.endswith("/refuse"):  # a provider refusing the key, inviting a retry
            return web.json_response(
                {"error": "invalid key"}, status=401, headers={"x-should-retry": "true"}
            )
        if path.endswith("/slow"):
            await asyncio.sleep(5)
        if path.endswith("/big"):
            return web.Response(body=b"x" * (3 * 2**20), content_type="application/octet-stream")
        answer = {  # credentials only as digests: a real provider never echoes a key either
            "path": request.path_qs,
            "authorization_sha256": _digest(request.headers.get("authorization")),
            "x_api_key_sha256": _digest(request.headers.get("x-api-key")),
            "usage": {"input_tokens": 11, "output_tokens": 7},
            "model": served,
        }
        return web.json_response(answer)

    async def _sse(self, request: web.Request, served: str, delay: float) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        events = [
            {
                "type": "message_start",
                "message": {"model": served, "usage": {"input_tokens": 21, "output_tokens": 1}},
            },
            {"type": "content_block_delta", "delta": {"text": "hello"}},
            {"type": "message_delta", "usage": {"output_tokens": 9}},
            {"type": "message_stop"},
        ]
        for event in events:
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
            await asyncio.sleep(delay)
        return response


def _asked_model(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return "unnamed"
    return str(doc.get("model") or "unnamed") if isinstance(doc, dict) else "unnamed"
