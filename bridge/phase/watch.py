"""The disk limit while a container runs: a watchdog beside each task container measures the
folders the task writes on the host (its worktree and its task folder, where verification
checkouts live) and kills the container once they pass `limits.disk_mb`, or once free disk under
the state root falls below the reserve. Measuring walks the folders, so it is spaced by ten times
what the last walk took (at least every half second)."""

from __future__ import annotations

import shutil
import threading
import time

from bridge.phase.handle import PhaseHandle
from bridge.workspace.disk import reserve_bytes
from bridge.workspace.fs import TreeTooDeep, tree_size


class DiskWatch:
    """Call it as `run_container(..., watchdog=DiskWatch(...))`; then ask `message`."""

    def __init__(self, handle: PhaseHandle) -> None:
        self.handle = handle
        home, task_id = handle.ctx.home, handle.task_id
        # The worktree (a layered one's upper dir: its base tree is shared and read-only), the
        # private git dir the worker may write, and the task folder (a layered verification
        # checkout keeps its upper dir there and its mount point outside).
        layers = home / "layers" / task_id
        self.roots = [
            layers if layers.is_dir() else home / "worktrees" / task_id,
            home / "gitdirs" / task_id,
            handle.ctx.task_dir(task_id),
        ]
        self.limit = handle.limits.disk_mb * 2**20
        self.used: int | None = None  # bytes measured when the limit was passed
        self.low_free: int | None = None  # free bytes when the reserve was passed
        self.too_deep: str | None = None  # a folder tree too deep to measure

    def __call__(self, container_id: str, ended: threading.Event) -> None:
        interval = 0.5
        while not ended.wait(interval):
            started = time.monotonic()
            if self.passed():
                self.handle.ctx.sandbox.kill(container_id)
                return
            interval = min(max(0.5, 10 * (time.monotonic() - started)), 10.0)

    def passed(self) -> bool:
        """Measure now; True (and remembered) when a limit is passed."""
        try:
            used = tree_size(self.roots)
        except TreeTooDeep as exc:
            self.too_deep = str(exc)
            return True
        if used > self.limit:
            self.used = used
            return True
        home = self.handle.ctx.home
        free = shutil.disk_usage(home).free
        if free < reserve_bytes(home, self.handle.ctx.config.disk_reserve_gb):
            self.low_free = free
            return True
        return False

    def message(self, who: str) -> str | None:
        """One sentence when a limit was passed (``who``: the worker, a verification command)."""
        if self.used is not None:
            return (
                f"{who} used {self.used / 2**20:.0f} MB of disk, over the "
                f"{self.limit / 2**20:.0f} MB limit (limits.disk_mb); it was stopped."
            )
        if self.too_deep is not None:
            return (
                f"{who} made a folder tree too deep to measure ({self.too_deep}); it was stopped."
            )
        if self.low_free is not None:
            return (
                f"{who} was stopped: only {self.low_free / 2**30:.1f} GiB stayed free under "
                f"{self.handle.ctx.home}, below the reserve (disk_reserve_gb)."
            )
        return None
