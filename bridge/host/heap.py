"""The process's garbage collector around work that makes many objects that all live on: a
server's start-up heap frozen out of later collections, and collections paused while a bulk
step (accept's listing and writing of 100,000 paths) builds its lists. Both measured: a full
collection walks every tracked object, so a heap that only grows pays one again and again
(docs/benchmarks.md: the store's p99, the large task's accept)."""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_pausing = 0  # the threads inside `collections_paused` now
_resume = False  # whether the collector was on when the first of them came in
_ours = False  # whether it is off because of a pause (not the process's own choice)


def freeze_start_up_heap() -> None:
    """For a long-lived server, just before it serves: collect once, then leave what start-up
    made (modules, classes, pydantic's validators: some 35,000 objects) out of every later
    collection. A full collection of that heap took 7-20 ms here, and a server paid it every
    few dozen requests, as the slowest of its reads (docs/benchmarks.md, the store). What it
    makes from now on is collected as ever; start-up's objects live as long as the server."""
    gc.collect()
    gc.freeze()


class collections_paused:  # (lower case: used as a function, `with collections_paused():`)
    """No automatic collection inside (in the whole process: the collector is global), for a
    step that only builds what it keeps, bounded by its input and short: never around a wait,
    nor around a `yield` (a generator left in a cycle inside would wait for the collector).
    At 100,000 changed paths accept's lists triggered collections worth 0.8 s of its 4 s, each
    walking all that was built so far. Nested and concurrent uses are counted: the last one
    out turns the collector back on, if it was on; cycles made inside are collected after.
    A pause cut short between its first steps (a signal) is repaired by the next one: the
    collector it turned off counts as on."""

    def __enter__(self) -> None:
        global _pausing, _resume, _ours
        with _lock:
            if _pausing == 0:
                _resume = gc.isenabled() or _ours
                _ours = True  # set before the collector goes off: a pause cut here is repaired
                gc.disable()
            _pausing += 1

    def __exit__(self, *exc: object) -> None:
        global _pausing, _ours
        with _lock:
            _pausing -= 1
            if _pausing == 0:
                _ours = False
                if _resume:
                    gc.enable()
