"""Start turns: at most one `worker-bridge` command per CPU loads the bridge at a time, host-wide.

Loading the bridge (pydantic's models, docker-py, the store, the configuration, recovery) is
about 0.45 s of CPU and nothing else. When many commands start at once (a script or an agent
launching eight `tasks run`), they would all load side by side and all be ready only at the
end, the ones that could run now slowed by the ones that will only wait for a free slot. In
turns of one per CPU, the first are ready in the time one load takes and start their tasks
while the rest load. The same CPU is spent either way; only who waits changes
(docs/benchmarks.md: 8 tasks at limit 4).

A turn is an exclusive `flock` on one of `<home>/locks/start-<i>` (i below the number of CPUs
this process may run on), held from before the imports until the facade is set up. Closing the
file lets it go, and so does the process's end, whatever ends it. The gate never fails a
command: a state root that does not exist yet (the gate makes none) or that it cannot write,
or a wait past MAX_WAIT_S (a command stuck while it holds a turn), lets the command go ahead
without one. Standard library only, as it runs before the imports it paces."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from bridge.config_names import default_home

MAX_WAIT_S = 10.0  # a command waits at most this long for a turn, then goes without one
POLL_S = 0.005


def cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _take(folder: Path, slots: int) -> int | None:
    """A held turn's descriptor, or None when every turn is taken."""
    for i in range(slots):
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(folder / f"start-{i}", flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            os.close(fd)
    return None


def wait_for_turn(folder: Path, slots: int, max_wait: float = MAX_WAIT_S) -> int | None:
    """Wait for one of ``slots`` turns in ``folder``: the held turn's descriptor, or None (no
    turn within ``max_wait``, or a folder it cannot use)."""
    try:
        folder.mkdir(mode=0o700, exist_ok=True)  # in a state root that exists: none is made
        deadline = time.monotonic() + max_wait
        fd = _take(folder, slots)
        while fd is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
            fd = _take(folder, slots)
        return fd
    except OSError:
        return None


@contextlib.contextmanager
def turn() -> Iterator[bool]:
    """Hold one of the host's start turns for the body; yields whether one is held."""
    fd = wait_for_turn(default_home() / "locks", cpus(), MAX_WAIT_S)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)
