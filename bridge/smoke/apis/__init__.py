"""The scripted model server's APIs, one module each: what a request's conversation is, how a
key is checked and refused, and how an action is streamed back in that API's own shape."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from bridge.smoke.apis import anthropic, chat, responses
from bridge.smoke.script import Conversation, Final, Write


class Api(Protocol):
    name: str  # "anthropic", "responses", "chat"
    path: str  # the POST path it serves, e.g. "/v1/messages"

    def authorized(self, headers: dict[str, str], key: str) -> bool: ...

    def refuse(self) -> web.Response: ...  # the provider's own 401

    def conversation(self, body: dict[str, Any]) -> Conversation: ...

    async def respond(
        self, request: web.Request, body: dict[str, Any], action: Write | Final
    ) -> web.StreamResponse: ...


API_ROUTES: list[Api] = [m.API for m in (anthropic, responses, chat) if m.API is not None]
