"""Per-repository locks that hold across processes (flock on a file under the state root)."""

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
    lock_dir = home / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(str(repo).encode()).hexdigest()[:24]
    fd = os.open(lock_dir / f"repo-{digest}.lock", os.O_RDWR | os.O_CREAT, 0o644)
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
                        f"Timed out after {timeout:.0f} s waiting for the lock on {repo}; "
                        "another worker-bridge process is holding it."
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        yield
    finally:
        os.close(fd)
