"""A scripted model server on the host's loopback, for the real-worker tests, the benchmarks and
`images build --smoke`: it speaks the Anthropic Messages, OpenAI Responses and Chat Completions
streaming APIs (one module each under bridge/smoke/apis/), chooses what to answer from the
conversation it is sent, and logs every request. No provider is reachable from the tests or a CI
runner; this lets the real CLI binaries run end to end anyway.

What the model does is written into the task's own text as directives, one per line:

    @write PATH: CONTENT        the first turn writes PATH (relative to the repository) with its
                                file-writing tool; CONTENT may use \n for new lines
    @repair-write PATH: CONTENT a later turn whose message says "Verification failed" writes this
                                instead (found anywhere in the conversation: proves it was resumed)
    @follow-write PATH: CONTENT a later turn (any other follow-up) writes this
    @say TEXT                   the final message (default "Done."; \n in it is a new line)
    @fail-auth                  answer 401 as the provider does for a refused key
    @hang                       never answer (the CLI waits: the task's deadline must end it)

After a tool result the model answers with its final message. A request without tools (a CLI's
title or topic call) gets a short text answer. The key the model expects is ``key``; any other
is refused with the provider's 401."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bridge.smoke.apis import API_ROUTES, Api
from bridge.smoke.loopback import LoopbackServer
from bridge.smoke.script import Hang, Refuse, decide


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    raw: bytes
    api: str | None = None
    at: float = field(default_factory=time.time)  # when it arrived (the benchmarks use it)

    @property
    def text(self) -> str:
        return self.raw.decode("utf-8", "replace")


@dataclass
class ModelServer(LoopbackServer):
    """The server. ``key`` is the real credential the gateway must add on the host."""

    key: str
    port: int = 0
    requests: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # ends @hang requests

    def routes(self, app: web.Application) -> None:
        for api in API_ROUTES:
            app.router.add_route("POST", api.path, self._handler(api))
        app.router.add_route("*", "/{tail:.*}", self._unexpected)

    # -- what the tests look at -------------------------------------------------------------

    def api_requests(self, api: str | None = None) -> list[Seen]:
        return [r for r in self.requests if r.api is not None and (api is None or r.api == api)]

    def unexpected(self) -> list[Seen]:
        """Requests to a path no API serves (a CLI calling out to something else)."""
        return [r for r in self.requests if r.api is None]

    # -- serving ----------------------------------------------------------------------------

    async def _record(self, request: web.Request, api: str | None) -> Seen:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        seen = Seen(
            request.method,
            request.path_qs,
            {k.lower(): v for k, v in request.headers.items()},
            body if isinstance(body, dict) else None,
            raw,
            api,
        )
        self.requests.append(seen)
        return seen

    async def _unexpected(self, request: web.Request) -> web.Response:
        await self._record(request, None)
        return web.json_response({"error": "not served by the scripted model"}, status=404)

    def _handler(self, api: Api):
        async def handle(request: web.Request) -> web.StreamResponse:
            seen = await self._record(request, api.name)
            if not api.authorized(seen.headers, self.key):
                return api.refuse()
            conv = api.conversation(seen.body or {})
            action = decide(conv)
            if isinstance(action, Refuse):
                return api.refuse()
            if isinstance(action, Hang):
                await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 600)
                return web.Response(status=503)
            return await api.respond(request, seen.body or {}, action)

        return handle
