"""Per-repository, per-job and base-tree locks that hold across processes (flock on a file under
the state root)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bridge.errors import BridgeError


@contextmanager
def repository_lock(home: Path, repo: Path, timeout: float = 120.0) -> Iterator[None]:
    """Hold the lock of ``repo``; waits up to ``timeout`` seconds for another holder."""
    digest = hashlib.sha256(str(repo).encode()).hexdigest()[:24]
    with _flock(home / "locks" / f"repo-{digest}.lock", str(repo), timeout):
        yield


@contextmanager
def job_lock(home: Path, job_id: str, timeout: float = 120.0) -> Iterator[None]:
    """Hold the lock of job ``job_id`` (accepting through it is one at a time, across
    processes); waits up to ``timeout`` seconds for another holder."""
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:24]
    with _flock(home / "locks" / f"job-{digest}.lock", f"job {job_id}", timeout):
        yield


@contextmanager
def bases_lock(home: Path, timeout: float = 600.0) -> Iterator[None]:
    """Hold the lock of the base trees (`<home>/bases`): held while one is picked or made and
    marked in use, and while prune checks one is unused and takes it out of the way, so that
    no task starts on a base between prune's check and its removal. Making a base (a whole
    checkout) happens under it, hence the longer wait."""
    with _flock(home / "locks" / "bases.lock", "the base trees", timeout):
        yield


@contextmanager
def _flock(path: Path, what: str, timeout: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BridgeError(
                        f"Timed out after {timeout:.0f} s waiting for the lock on {what}; "
                        "another worker-bridge process is holding it."
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        yield
    finally:
        os.close(fd)
