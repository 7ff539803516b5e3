"""The OpenAI Responses API as Codex CLI speaks it: `POST /v1/responses` with a Bearer key,
answered as server-sent events (`response.created`, the output item added and done, text
deltas, `response.completed` with usage). A file write is Codex's own `apply_patch` tool: a
custom (freeform) tool call whose input is a patch with a path relative to the workspace."""

from __future__ import annotations

import itertools
from typing import Any

from aiohttp import web

from bridge.smoke.script import Conversation, Final, Write
from bridge.smoke.sse import open_sse, sse

_ids = itertools.count(1)
_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")
# What Codex itself sends in the user's role (its environment, AGENTS.md): not the user's words.
_CONTEXT = ("<environment_context>", "# AGENTS.md instructions", "<user_instructions>")
_USAGE = {
    "input_tokens": 100,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 20,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 120,
}


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        parts = [content]
    else:
        parts = [
            str(part.get("text", ""))
            for part in content or []
            if isinstance(part, dict) and part.get("type") == "input_text"
        ]
    return [text for text in parts if not text.lstrip().startswith(_CONTEXT)]


def patch(path: str, content: str) -> str:
    """A patch giving PATH exactly CONTENT. `*** Add File` also replaces a file that exists
    (Codex 0.171 writes it whole), so a follow-up needs no update hunk against the old text."""
    lines = "".join(f"+{line}\n" for line in content.removesuffix("\n").split("\n"))
    return f"*** Begin Patch\n*** Add File: {path}\n{lines}*** End Patch"


class ResponsesApi:
    name = "responses"
    path = "/v1/responses"

    def authorized(self, headers: dict[str, str], key: str) -> bool:
        return headers.get("authorization") == f"Bearer {key}"

    def refuse(self) -> web.Response:
        error = {
            "message": "Incorrect API key provided: sk-***. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
        return web.json_response({"error": error}, status=401)

    def conversation(self, body: dict[str, Any]) -> Conversation:
        """User texts from the `input` messages in the user's role (`instructions` and
        Codex's developer and context messages are not the user's)."""
        items = [i for i in body.get("input") or [] if isinstance(i, dict)]
        user = [
            text
            for item in items
            if item.get("role") == "user" and item.get("type", "message") == "message"
            for text in _texts(item.get("content"))
        ]
        after_tool = bool(items) and items[-1].get("type") in _TOOL_OUTPUTS
        return Conversation(user, after_tool, bool(body.get("tools")), body.get("model"))

    async def respond(
        self, request: web.Request, body: dict[str, Any], action: Write | Final
    ) -> web.StreamResponse:
        n = next(_ids)
        item: dict[str, Any]
        if isinstance(action, Write):
            item = {
                "type": "custom_tool_call",
                "id": f"ctc_{n}",
                "call_id": f"call_{n}",
                "name": "apply_patch",
                "input": patch(action.path, action.content),
            }
        else:
            part = {"type": "output_text", "text": action.text, "annotations": []}
            item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "content": [part]}
        response = await open_sse(request)
        head = {"id": f"resp_{n}", "object": "response", "model": body.get("model")}

        async def event(kind: str, **data: Any) -> None:
            await sse(response, {"type": kind, **data}, kind)

        await event("response.created", response={**head, "status": "in_progress", "output": []})
        started = {**item, "status": "in_progress"}
        await event("response.output_item.added", output_index=0, item=started)
        if isinstance(action, Final):
            ids = {"item_id": item["id"], "output_index": 0, "content_index": 0}
            await event("response.output_text.delta", delta=action.text, **ids)
            await event("response.output_text.done", text=action.text, **ids)
        done = {**item, "status": "completed"}
        await event("response.output_item.done", output_index=0, item=done)
        final = {**head, "status": "completed", "output": [done], "usage": _USAGE}
        await event("response.completed", response=final)
        await response.write_eof()
        return response


API = ResponsesApi()
