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
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from bridge.config.names import default_home

MAX_WAIT_S = 10.0  # a command waits at most this long for a turn, then goes without one
POLL_S = 0.005


def cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _open_turns(folder: Path, slots: int) -> list[int]:
    """The turns' files, opened once for the whole wait. Only regular files: a link is never
    followed (`O_NOFOLLOW`), and something else planted at a turn's name (a FIFO, a device) is
    refused before it is opened, and again after (`O_NONBLOCK`: an open that would block
    does not)."""
    fds: list[int] = []
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        for i in range(slots):
            path = folder / f"start-{i}"
            if path.is_symlink() or (path.exists() and not path.is_file()):
                raise OSError(f"{path} is not a regular file")
            fds.append(os.open(path, flags, 0o600))
            if not stat.S_ISREG(os.fstat(fds[-1]).st_mode):
                raise OSError(f"{path} is not a regular file")
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _take(fds: list[int]) -> int | None:
    """The first of ``fds`` whose turn this process now holds, or None when all are taken."""
    for fd in fds:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            continue
    return None


def wait_for_turn(folder: Path, slots: int, max_wait: float = MAX_WAIT_S) -> int | None:
    """Wait for one of ``slots`` turns in ``folder``: the held turn's descriptor, or None (no
    turn within ``max_wait``, or a folder it cannot use)."""
    try:
        folder.mkdir(mode=0o700, exist_ok=True)  # in a state root that exists: none is made
        fds = _open_turns(folder, slots)
    except OSError:
        return None
    held = None
    try:
        deadline = time.monotonic() + max_wait
        held = _take(fds)
        while held is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
            held = _take(fds)
        return held
    finally:
        for fd in fds:
            if fd != held:
                os.close(fd)


@contextlib.contextmanager
def turn() -> Iterator[bool]:
    """Hold one of the host's start turns for the body; yields whether one is held."""
    fd = wait_for_turn(default_home() / "locks", cpus(), MAX_WAIT_S)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)
