"""What the gateway records: a `network.request` event per request and a `network.refused` one
per refusal (bounded per task, then a single note), and the task's usage summary (requests,
bytes, tokens by model)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.documents import TokenCounts, UsageDoc
from bridge.events import Destination, EventData, NetworkRequest
from bridge.gateway.usage import TokenCounter


@dataclass
class Usage:
    requests: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    tokens: dict[str, TokenCounts] = field(default_factory=dict)

    def add_tokens(self, counter: TokenCounter | None) -> None:
        """Tokens filed under the model the upstream's answer named (what the sandbox asked
        for is its own word, and may be anything)."""
        if counter is not None and (counter.input or counter.output):
            model = counter.model or "unnamed"
            entry = self.tokens.setdefault(model, TokenCounts(input=0, output=0))
            entry["input"] += counter.input
            entry["output"] += counter.output

    def merge(self, other: UsageDoc | None) -> None:
        """Add a usage document recorded earlier (an earlier turn's)."""
        if not other:
            return
        self.requests += int(other.get("requests", 0))
        self.bytes_up += int(other.get("bytes_up", 0))
        self.bytes_down += int(other.get("bytes_down", 0))
        for model, counts in (other.get("tokens") or {}).items():
            entry = self.tokens.setdefault(model, TokenCounts(input=0, output=0))
            entry["input"] += int(counts.get("input", 0))
            entry["output"] += int(counts.get("output", 0))

    def document(self) -> UsageDoc:
        return UsageDoc(
            requests=self.requests,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            tokens=self.tokens,
        )


class Accounting:
    def __init__(
        self, emit: Callable[[str, EventData], None], max_events: int, recorded: int = 0
    ) -> None:
        """``recorded``: the task's network events already stored (by an earlier gateway)."""
        self._emit = emit
        self.max_events = max_events
        self.usage = Usage()
        self._events = recorded

    def event(self, kind: str, data: EventData) -> None:
        self._events += 1
        if self._events <= self.max_events:
            self._emit(kind, data)
        elif self._events == self.max_events + 1:
            note = f"more than {self.max_events} network events: the rest are not recorded"
            self._emit("network.request", {"note": note})

    def refused(self, key: str, target: str, reason: str, **extra: object) -> None:
        """A `network.refused` event: what was refused (``key``: host, route, request or
        connection) and why."""
        self.event("network.refused", {key: target, "reason": reason, **extra})

    def request(
        self,
        where: Destination,
        method: str,
        status: int,
        up: int,
        down: int,
        started: float,
        counter: TokenCounter | None = None,
        error: str | None = None,
    ) -> None:
        usage = self.usage
        usage.requests += 1
        usage.bytes_up += up
        usage.bytes_down += down
        usage.add_tokens(counter)
        data = NetworkRequest(
            **where,
            method=method,
            status=status,
            bytes_up=up,
            bytes_down=down,
            duration_s=round(time.monotonic() - started, 3),
        )
        if counter is not None and counter.model:
            data["model"] = counter.model
        if counter is not None and (counter.input or counter.output):
            data["input_tokens"] = counter.input
            data["output_tokens"] = counter.output
        if error:
            data["error"] = error
        self.event("network.request", data)
