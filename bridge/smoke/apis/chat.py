"""OpenAI Chat Completions (`POST /v1/chat/completions`), as OpenCode's `openai-compatible`
provider speaks it: a `Write` becomes a call of OpenCode's own `write` tool (an absolute
`filePath` under /workspace and the `content`), streamed as `chat.completion.chunk` events."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from bridge.smoke.script import Conversation, Final, Write
from bridge.smoke.sse import open_sse, sse

WORKSPACE = "/workspace"


def _text(content: Any) -> str:
    """A message's text: a string, or the text of its content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


class ChatApi:
    name = "chat"
    path = "/v1/chat/completions"

    def authorized(self, headers: dict[str, str], key: str) -> bool:
        return headers.get("authorization") == f"Bearer {key}"

    def refuse(self) -> web.Response:
        error = {
            "message": "Incorrect API key provided",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
        return web.json_response({"error": error}, status=401)

    def conversation(self, body: dict[str, Any]) -> Conversation:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        return Conversation(
            user_texts=[_text(m.get("content")) for m in messages if m.get("role") == "user"],
            after_tool=bool(messages) and messages[-1].get("role") == "tool",
            has_tools=bool(body.get("tools")),
            model=body.get("model"),
        )

    async def respond(
        self, request: web.Request, body: dict[str, Any], action: Write | Final
    ) -> web.StreamResponse:
        model = body.get("model") or "scripted"
        if isinstance(action, Write):
            arguments = json.dumps(
                {"filePath": f"{WORKSPACE}/{action.path.lstrip('/')}", "content": action.content}
            )
            call = {
                "id": f"call_{time.time_ns()}",
                "type": "function",
                "function": {"name": "write", "arguments": arguments},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": action.text}
            finish = "stop"
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        head = {"id": f"chatcmpl-{time.time_ns()}", "created": int(time.time()), "model": model}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return web.json_response(
                {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            )

        response = await open_sse(request)

        async def chunk(delta: dict[str, Any] | None, reason: str | None = None, **more: Any):
            choices = (
                [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": reason}]
            )
            data = {**head, "object": "chat.completion.chunk", "choices": choices, **more}
            await sse(response, data)

        if isinstance(action, Write):
            await chunk(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"index": 0, **message["tool_calls"][0]}],
                }
            )
        else:
            await chunk({"role": "assistant", "content": action.text})
        await chunk({}, finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            await chunk(None, usage=usage)
        await response.write(b"data: [DONE]\n\n")  # not JSON, so not through sse()
        await response.write_eof()
        return response


API = ChatApi()
