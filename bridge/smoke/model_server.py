"""A scripted model server on the host's loopback, for the real-worker tests, the benchmarks and
`images build --smoke`: it speaks the Anthropic Messages, OpenAI Responses and Chat Completions
streaming APIs (one module each under bridge/smoke/apis/), chooses what to answer from the
conversation it is sent, and logs every request. No provider is reachable from the tests or a CI
runner; this lets the real CLI binaries run end to end anyway.

What the model does is written into the task's own text as directives, one per line:

    @write PATH: CONTENT        the first turn writes PATH (relative to the repository) with its
                                file-writing tool; CONTENT may use \\n for new lines
    @repair-write PATH: CONTENT a later turn whose message says "Verification failed" writes this
                                instead (found anywhere in the conversation: proves it was resumed)
    @follow-write PATH: CONTENT a later turn (any other follow-up) writes this
    @say TEXT                   the final message (default "Done."; \\n in it is a new line)
    @fail-auth                  answer 401 as the provider does for a refused key
    @hang                       never answer (the CLI waits: the task's deadline must end it)

After a tool result the model answers with its final message. A request without tools (a CLI's
title or topic call) gets a short text answer. The key the model expects is ``key``; any other
is refused with the provider's 401.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bridge.smoke.loopback import LoopbackServer

_DIRECTIVE = re.compile(
    r"^@(write|repair-write|follow-write|say|fail-auth|hang)\b[ \t]*(.*)$", re.M
)


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


@dataclass(frozen=True)
class Write:
    path: str
    content: str


@dataclass(frozen=True)
class Final:
    text: str


@dataclass(frozen=True)
class Refuse:
    """Answer 401 as the provider does."""


@dataclass(frozen=True)
class Hang:
    """Never answer."""


Action = Write | Final | Refuse | Hang


@dataclass
class Conversation:
    """What an API module reads out of a request, in the same terms for every API."""

    user_texts: list[str]  # the user's messages, oldest first (tool results left out)
    after_tool: bool  # the last message is a tool's result
    has_tools: bool  # the request offers tools (a title call does not)
    model: str | None = None


def _directives(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2).strip()) for m in _DIRECTIVE.finditer(text)]


def _write(arg: str) -> Write:
    path, _, content = arg.partition(":")
    return Write(path.strip(), content.strip().replace("\\n", "\n"))


def decide(conv: Conversation) -> Action:
    """What the scripted model does next."""
    everything = "\n".join(conv.user_texts)
    said = [arg for name, arg in _directives(everything) if name == "say"]
    final = Final(said[-1].replace("\\n", "\n") if said else "Done.")
    if not conv.has_tools:
        return Final("A scripted title")
    latest = conv.user_texts[-1] if conv.user_texts else ""
    own = _directives(latest)
    if any(name == "hang" for name, _ in own):
        return Hang()
    if any(name == "fail-auth" for name, _ in own):
        return Refuse()
    if conv.after_tool:
        return final
    if len(conv.user_texts) > 1 or "Verification failed" in latest:
        wanted = "repair-write" if "Verification failed" in latest else "follow-write"
        for name, arg in _directives(everything):
            if name == wanted:
                return _write(arg)
    for name, arg in own:
        if name == "write":
            return _write(arg)
    return final


@dataclass
class ModelServer(LoopbackServer):
    """The server. ``key`` is the real credential the gateway must add on the host."""

    key: str
    port: int = 0
    requests: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # ends @hang requests

    def routes(self, app: web.Application) -> None:
        from bridge.smoke.apis import API_ROUTES

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

    def _handler(self, api):
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


async def sse(response: web.StreamResponse, data: dict[str, Any], event: str | None = None) -> None:
    """Write one server-sent event (``event:`` line when named)."""
    head = f"event: {event}\n" if event else ""
    await response.write(f"{head}data: {json.dumps(data)}\n\n".encode())


async def open_sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
    )
    await response.prepare(request)
    return response
