"""Bounded waits: a condition polled with backoff until a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psutil

T = TypeVar("T")


def poll(check: Callable[[], T], what: str, deadline_s: float = 60.0) -> T:
    """Return check()'s first truthy value, polling (with backoff) until a deadline."""
    deadline = time.monotonic() + deadline_s
    delay = 0.05
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {deadline_s} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.3)


def process_gone(pid: int) -> bool:
    """Whether ``pid`` ended (a zombie has: PID 1 here may not reap what it inherits)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
