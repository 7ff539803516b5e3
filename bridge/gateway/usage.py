"""Token accounting for model routes: the input and output tokens a response reports and the
model it says answered, from a JSON body or a server-sent event stream as it passes (the
Anthropic Messages, OpenAI Responses and Chat Completions shapes). Parsing is bounded and never
holds a response back: the bytes are forwarded first, then looked at. The request is never
parsed: its body streams through unread, and the model it names is the sandbox's word."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from bridge.models import JsonObject

# What one exchange keeps to read usage from, within its share of the gateway's byte budget
# (exchange.EXCHANGE_BYTES): longer SSE lines pass through unparsed (usage events are small),
# and of a JSON answer only its head (where the model is named) and tail (where usage is).
MAX_EVENT_LINE = 64 * 1024
JSON_END = 64 * 1024
_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
_USAGE = re.compile(rb'"usage"\s*:\s*\{')


@dataclass
class TokenCounter:
    """Input and output tokens seen in one response, and the model it named (the first)."""

    input: int = 0
    output: int = 0
    model: str | None = None
    _pending: bytearray = field(default_factory=bytearray)
    _skipping: bool = False

    def feed_event_stream(self, chunk: bytes) -> None:
        """Look at one chunk of an SSE response (`data: {...}` lines)."""
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl == -1:
                rest = chunk[start:]
                if len(self._pending) + len(rest) > MAX_EVENT_LINE:
                    self._pending.clear()
                    self._skipping = True
                elif not self._skipping:
                    self._pending += rest
                return
            line = bytes(self._pending) + chunk[start:nl]
            skipped = self._skipping
            self._pending.clear()
            self._skipping = False
            start = nl + 1
            if not skipped and line.startswith(b"data:"):
                self._event(line[5:].strip())

    def feed_json(self, body: bytes) -> None:
        """Usage from a whole JSON response."""
        self._event(body)

    def feed_json_ends(self, head: bytes, tail: bytes) -> None:
        """Usage from a JSON response too long to keep whole: the model named in its head, the
        last `usage` object in its tail."""
        if self.model is None and (named := _MODEL.search(head)):
            self.model = named.group(1).decode("utf-8", "replace")
        for found in reversed(list(_USAGE.finditer(tail))):
            try:
                usage, _ = json.JSONDecoder().raw_decode(tail[found.end() - 1 :].decode())
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(usage, dict):
                self.feed_document({"usage": usage})
                return

    def _event(self, data: bytes) -> None:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(doc, dict):
            self.feed_document(doc)

    def feed_document(self, doc: JsonObject) -> None:
        """Usage from one JSON document: a whole response or one streamed event."""
        if self.model is None:
            self.model = _model(doc)
        for usage in _usages(doc):
            self.input = max(self.input, _int(usage, "input_tokens", "prompt_tokens"))
            self.output = max(self.output, _int(usage, "output_tokens", "completion_tokens"))


def _model(doc: JsonObject) -> str | None:
    """The model an answer names: on the document (Messages, Chat Completions chunks), or on
    its `message` (Messages' message_start) or `response` (Responses' events)."""
    for holder in (doc, doc.get("message"), doc.get("response")):
        if isinstance(holder, dict) and isinstance(holder.get("model"), str) and holder["model"]:
            return holder["model"][:200]
    return None


def _usages(doc: JsonObject) -> list[JsonObject]:
    found = []
    for holder in (doc, doc.get("message"), doc.get("response")):
        if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
            found.append(holder["usage"])
    return found


def _int(usage: JsonObject, *names: str) -> int:
    for name in names:
        value = usage.get(name)
        if isinstance(value, int):
            return value
    return 0


class JsonEnds:
    """The head and tail of a JSON answer as it passes (each at most JSON_END bytes), or the
    whole of it when it is no longer than both together."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.whole = True

    def feed(self, chunk: bytes) -> None:
        room = JSON_END - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > JSON_END:
                self.whole = False
                del self.tail[: len(self.tail) - JSON_END]

    def read_into(self, counter: TokenCounter) -> None:
        if self.whole:
            counter.feed_json(bytes(self.head + self.tail))
        else:
            counter.feed_json_ends(bytes(self.head), bytes(self.tail))
