"""Stopping the warm processes (bridge/warm) a test or session started in its folder: each is
found by its lock, which it holds from before it loads until it stops taking commands, so one
still loading (not yet answering) is waited for and stopped too, not left running after its
folder is gone."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from bridge.warm.client import control


def _held(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def stop_all(folder: Path, deadline_s: float = 60.0) -> None:
    """Stop every warm process of ``folder``: each has let go of its lock when this returns (a
    command it still runs ends on its own)."""
    deadline = time.monotonic() + deadline_s
    for lock in folder.glob("*.lock"):
        sock = str(lock.with_suffix(".sock"))
        while _held(lock):
            if time.monotonic() > deadline:
                raise AssertionError(f"the warm process of {lock} did not stop")
            control("stop", sock)
            time.sleep(0.1)
