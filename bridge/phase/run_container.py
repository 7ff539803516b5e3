"""The lifecycle of one task container, the same for the worker and for verification: start it
(or adopt the one a dead runner left), record its id before anything can strand it, stream its
output to readers, wait for it against the task's deadline, and remove it."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from bridge.phase.handle import PhaseHandle
from bridge.sandbox import LABEL, ContainerSpec, ExitInfo

READER_GRACE_S = 30.0  # how long the output readers may lag behind the container's exit


@dataclass
class Reader:
    """Consumes one view of a container's output (stdout, stderr or both) in its own thread."""

    consume: Callable[[Iterator[bytes]], None]
    stdout: bool = True
    stderr: bool = True


@dataclass
class ContainerRun:
    container_id: str
    adopted: bool
    exit: ExitInfo


def run_container(
    handle: PhaseHandle,
    spec: ContainerSpec,
    *,
    readers: Sequence[Reader] = (),
    adopt: bool = False,
    on_start: Callable[[str, bool], None] | None = None,
    on_exit: Callable[[ExitInfo], None] | None = None,
    watchdog: Callable[[str, threading.Event], None] | None = None,
    timeout: float | None = None,
) -> ContainerRun:
    """Run one container to its end. ``adopt``: take over a running or exited container with
    the same labels (a runner died while it ran) instead of starting a new one; its readers
    then read its output from the start (the worker's skips what was already recorded). ``on_exit``
    runs before the container is removed, so what it records survives a crash. ``watchdog``
    runs in a thread beside the wait until the container ends (it may kill the container when
    a limit is passed). ``timeout`` bounds the wait below the task's deadline (a phase's own
    deadline); past it the container is killed and its exit says `timed_out`."""
    sandbox = handle.ctx.sandbox
    existing = sandbox.containers(spec.labels) if adopt else []
    found = next((c for c in existing if c.state in ("running", "exited")), None)
    if found is not None:
        container_id = found.id  # its readers see its output from the start again
    else:
        for item in existing:
            sandbox.remove(item.id)
        # Recorded before the start: while set, a dead runner's lease keeps counting.
        handle.update(container_id="starting")
        container_id = sandbox.start(spec)
        handle.update(container_id=container_id)
        _note_origin(handle, spec, container_id)
    ended = threading.Event()
    # False on a BaseException but an interrupt: the container is left, as a crash would. An
    # interrupt (Ctrl-C) removes it here, before the phase's own clean-up unwinding after this
    # moves its checkout away (a checkout a container still holds is never trashed).
    finished = False
    try:
        if on_start is not None:
            on_start(container_id, found is not None)
        if handle.hooks is not None:
            role = spec.labels.get(f"{LABEL}.role", "")
            handle.hooks.container_started(handle, role, container_id)
        handle.ensure_active(kill=container_id)
        threads = [
            threading.Thread(
                target=reader.consume,
                args=(sandbox.output(container_id, stdout=r_out, stderr=r_err),),
                name=f"output-{container_id[:12]}",
                daemon=True,
            )
            for reader in readers
            for r_out, r_err in [(reader.stdout, reader.stderr)]
        ]
        if watchdog is not None:
            threads.append(
                threading.Thread(
                    target=watchdog, args=(container_id, ended), name="watchdog", daemon=True
                )
            )
        for thread in threads:
            thread.start()
        wait = handle.remaining() if timeout is None else min(timeout, handle.remaining())
        info = sandbox.wait(container_id, timeout=max(wait, 0.01))
        ended.set()
        until = time.monotonic() + READER_GRACE_S
        for thread in threads:
            thread.join(timeout=max(until - time.monotonic(), 0.01))
        if on_exit is not None:
            on_exit(info)
        finished = True
        return ContainerRun(container_id, found is not None, info)
    except (Exception, KeyboardInterrupt):
        finished = True
        raise
    finally:
        ended.set()
        if finished:
            _remove(handle, container_id)


def _remove(handle: PhaseHandle, container_id: str) -> None:
    """The container removed, unless the runner lost its claim (or died): it is left to the
    one that adopts it."""
    if handle.lost():
        return
    with interrupts_held():  # a second Ctrl-C would leave it running
        handle.ctx.sandbox.remove(container_id)
    handle.update(container_id=None)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """SIGINT ignored for the block when this is the main thread (the only one Python delivers
    it to); elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _note_origin(handle: PhaseHandle, spec: ContainerSpec, container_id: str) -> None:
    """Say whether the container came from the pool (when the pool is on; see
    bridge/sandbox/pool.py), and if not, why."""
    origin = getattr(handle.ctx.sandbox, "origin", None)
    note = origin(container_id) if origin is not None else None
    if note is not None:
        role = spec.labels.get(f"{LABEL}.role", "")
        handle.emit("sandbox.pool", {"role": role, "container": container_id[:12], **note})
