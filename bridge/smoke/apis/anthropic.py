"""Anthropic Messages (`POST /v1/messages`), as Claude Code speaks it: a `Write` becomes a call
of Claude Code's own `Write` tool (an absolute `file_path` under /workspace and the `content`),
streamed as the API's named server-sent events when the request asks for a stream."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from bridge.smoke.script import Conversation, Final, Write
from bridge.smoke.sse import open_sse, sse

WORKSPACE = "/workspace"


def _blocks(content: Any) -> list[dict[str, Any]]:
    """A message's content as blocks (the API allows a plain string for one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _text(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text")


class AnthropicApi:
    name = "anthropic"
    path = "/v1/messages"

    def authorized(self, headers: dict[str, str], key: str) -> bool:
        return headers.get("x-api-key") == key or headers.get("authorization") == f"Bearer {key}"

    def refuse(self) -> web.Response:
        error = {"type": "authentication_error", "message": "invalid x-api-key"}
        return web.json_response({"type": "error", "error": error}, status=401)

    def conversation(self, body: dict[str, Any]) -> Conversation:
        users = [
            _blocks(m.get("content"))
            for m in body.get("messages") or []
            if isinstance(m, dict) and m.get("role") == "user"
        ]
        # a user message that only carries tool results is not something the user said
        texts = [_text(blocks) for blocks in users if _text(blocks)]
        last = users[-1] if users else []
        return Conversation(
            user_texts=texts,
            after_tool=any(b.get("type") == "tool_result" for b in last),
            has_tools=bool(body.get("tools")),
            model=body.get("model"),
        )

    async def respond(
        self, request: web.Request, body: dict[str, Any], action: Write | Final
    ) -> web.StreamResponse:
        if isinstance(action, Write):
            tool_input = {
                "file_path": f"{WORKSPACE}/{action.path.lstrip('/')}",
                "content": action.content,
            }
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_{time.time_ns()}",
                "name": "Write",
                "input": tool_input,
            }
            stop = "tool_use"
        else:
            block = {"type": "text", "text": action.text}
            stop = "end_turn"
        message = {
            "id": f"msg_{time.time_ns()}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model") or "scripted",
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 10},
        }
        if not body.get("stream"):
            return web.json_response(message)

        response = await open_sse(request)

        async def event(name: str, **data: Any) -> None:
            await sse(response, {"type": name, **data}, event=name)

        started = {**message, "content": [], "stop_reason": None}
        started["usage"] = {"input_tokens": 100, "output_tokens": 1}
        await event("message_start", message=started)
        if block["type"] == "tool_use":
            await event("content_block_start", index=0, content_block={**block, "input": {}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            await event("content_block_start", index=0, content_block={"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": block["text"]}
        await event("content_block_delta", index=0, delta=delta)
        await event("content_block_stop", index=0)
        await event(
            "message_delta",
            delta={"stop_reason": stop, "stop_sequence": None},
            usage={"output_tokens": 10},
        )
        await event("message_stop")
        await response.write_eof()
        return response


API = AnthropicApi()
