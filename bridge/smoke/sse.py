"""Server-sent events as the providers stream them, for the scripted model's APIs."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web


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
