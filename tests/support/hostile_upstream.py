"""An upstream on loopback that answers the way a hostile or merely generous provider could, for
the review's memory tests: a large non-streamed answer (`/big-json?mb=N`, valid JSON with token
usage at its end, as a Chat Completions answer with many choices or log-probabilities is), and a
fast endless event stream (`/fast-sse`, until the client goes away or 256 MiB)."""

from __future__ import annotations

import functools
import json
import threading
from dataclasses import dataclass, field

from aiohttp import web

from bridge.smoke.loopback import LoopbackServer


@functools.cache
def _big_json(mb: int) -> bytes:
    filler = "x" * 1000
    choices = [{"index": i, "text": filler} for i in range(mb * 2**20 // 1024)]
    doc = {"model": "served-big", "choices": choices, "usage": {"input_tokens": 1}}
    return json.dumps(doc).encode()


@dataclass
class HostileUpstream(LoopbackServer):
    port: int = 0
    release: threading.Event = field(default_factory=threading.Event)

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/v1/big-json", self._big_json)
        app.router.add_route("*", "/v1/fast-sse", self._fast_sse)

    async def _big_json(self, request: web.Request) -> web.Response:
        return web.Response(
            body=_big_json(int(request.query.get("mb", "8"))), content_type="application/json"
        )

    async def _fast_sse(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        chunk = b"data: " + b"y" * 65530 + b"\n\n"
        sent = 0
        try:
            while sent < 256 * 2**20 and not self.release.is_set():
                await response.write(chunk)
                sent += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return response
