"""The process's garbage collector around work that makes many objects that all live on: a
server's start-up heap frozen out of later collections, and collections paused while a bulk
step (accept's listing and writing of 100,000 paths) builds its lists. Both measured: a full
collection walks every tracked object, so a heap that only grows pays one again and again
(docs/benchmarks.md: the store's p99, the large task's accept)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_pausing = 0  # the threads inside `collections_paused` now
_resume = False  # whether the collector was on when the first of them came in


def freeze_start_up_heap() -> None:
    """For a long-lived server, just before it serves: collect once, then leave what start-up
    made (modules, classes, pydantic's validators: some 35,000 objects) out of every later
    collection. A full collection of that heap took 7-20 ms here, and a server paid it every
    few dozen requests, as the slowest of its reads (docs/benchmarks.md, the store). What it
    makes from now on is collected as ever; start-up's objects live as long as the server."""
    gc.collect()
    gc.freeze()


@contextmanager
def collections_paused() -> Iterator[None]:
    """No automatic collection inside (in the whole process: the collector is global), for a
    step that only builds what it keeps, bounded by its input and short. At 100,000 changed
    paths accept's lists triggered collections worth 0.8 s of its 4 s, each walking all that
    was built so far. Nested and concurrent uses are counted: the last one out turns the
    collector back on, if it was on; cycles made inside are collected after, as ever."""
    global _pausing, _resume
    with _lock:
        if _pausing == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pausing += 1
    try:
        yield
    finally:
        with _lock:
            _pausing -= 1
            if _pausing == 0 and _resume:
                gc.enable()
