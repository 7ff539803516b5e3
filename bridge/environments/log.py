"""`environment.output` events: what a setup command or an image build prints, one event per
line, redacted, each line bounded and their number too, each naming its command."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from bridge.phase.handle import PhaseHandle
from bridge.sandbox.output import Tail, bounded_lines

MAX_OUTPUT_EVENTS = 1000  # environment.output events per setup or build


class OutputEvents:
    """Output as `environment.output` events (``command``: what is running now)."""

    def __init__(self, handle: PhaseHandle) -> None:
        self.handle = handle
        self.count = 0
        self.command = ""

    def consume(self, chunks: Iterable[bytes], tail: Tail | None = None) -> None:
        def fed() -> Iterator[bytes]:
            for chunk in chunks:
                if tail is not None:
                    tail.feed(chunk)
                yield chunk

        try:
            for line in bounded_lines(fed(), 16 * 1024):
                self.line(line)
        except Exception:  # a broken log stream must not break the run
            pass

    def line(self, line: str) -> None:
        """One line of output, as an event (blank lines and those past the bound are not)."""
        if not line.strip():
            return
        self.count += 1
        if self.count > MAX_OUTPUT_EVENTS:
            if self.count == MAX_OUTPUT_EVENTS + 1:
                note = f"[lines beyond {MAX_OUTPUT_EVENTS} are not recorded]"
                self.handle.emit("environment.output", {"text": note, "command": self.command})
            return
        text = self.handle.redactor.redact(line)[:2000]
        self.handle.emit("environment.output", {"text": text, "command": self.command})
