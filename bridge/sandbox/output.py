"""Reading what a container printed, in linear time and bounded memory, whatever it prints: a line
longer than the bound is cut (the rest of it is counted and skipped, never kept), and a tail keeps
only the last N bytes of a stream however long it runs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

CUT_MARK = " [worker-bridge: line cut, {n} more bytes not kept]"


def bounded_lines(chunks: Iterable[bytes], max_line: int) -> Iterator[str]:
    """Lines (decoded, without the newline) from a stream of chunks. Each chunk is scanned once;
    a line over ``max_line`` bytes yields its first ``max_line`` bytes and a note of the rest."""
    pending = bytearray()
    skipped = 0  # bytes of the current over-long line dropped so far
    for chunk in chunks:
        start = 0
        while start < len(chunk):
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl == -1 else nl
            room = max_line - len(pending)
            if skipped or end - start > room:
                take = max(room, 0)
                pending += chunk[start : start + take]
                skipped += end - start - take
            else:
                pending += chunk[start:end]
            if nl == -1:
                break
            yield _finish(pending, skipped)
            pending.clear()
            skipped = 0
            start = nl + 1
    if pending or skipped:
        yield _finish(pending, skipped)


def _finish(line: bytearray, skipped: int) -> str:
    text = bytes(line).decode(errors="replace").rstrip("\r")
    return text + CUT_MARK.format(n=skipped) if skipped else text


class Tail:
    """The last ``limit`` bytes of a stream (and how many came before them)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk[-self.limit :] if len(chunk) > self.limit else chunk
        over = len(self.buffer) - self.limit
        if over > 0:
            del self.buffer[:over]
            self.dropped += over
        self.dropped += max(len(chunk) - self.limit, 0)

    def text(self, chars: int | None = None) -> str:
        text = bytes(self.buffer).decode(errors="replace")
        return text if chars is None else text[-chars:]


class ChunkReader:
    """A file-like reader over an iterator of byte chunks (a streamed tar archive)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        if size < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data
