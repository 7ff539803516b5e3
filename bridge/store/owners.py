"""Who holds a lease or runs a task: a random id, plus the host, pid and process start time so
that a dead owner on this host is recognised at once (a recycled pid has another start time).
Owners on other hosts are trusted until their `expires_at` passes."""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field

HOST = socket.gethostname()


def _started(pid: int) -> float | None:
    import psutil  # here, not at the top: a command that only reads never asks

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def new_runner_id() -> str:
    return f"runner-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Owner:
    id: str = field(default_factory=new_runner_id)
    host: str = HOST
    pid: int = field(default_factory=os.getpid)
    pid_started: float | None = field(default_factory=lambda: _started(os.getpid()))


def process_alive(host: str | None, pid: int | None, pid_started: float | None) -> bool:
    """False only when we can tell: same host, and that pid is gone or is another process."""
    if not host or host != HOST or not pid:
        return True
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        started = proc.create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
    return pid_started is None or abs(started - pid_started) < 1.0


def owner_live(
    expires_at: float | None, host: str | None, pid: int | None, pid_started: float | None
) -> bool:
    """A claim or lease counts while it has not expired and its process is not known dead."""
    return (expires_at or 0) > time.time() and process_alive(host, pid, pid_started)
