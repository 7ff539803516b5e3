"""Storage safety: refuse to allocate a workspace when free disk is below the reserve."""

from __future__ import annotations

import shutil
from pathlib import Path

from bridge.errors import DiskFull


def check_free_space(home: Path, reserve_gb: float | None) -> None:
    """Raise when free space under ``home`` is below ``reserve_gb`` (default: the larger of
    10 GiB and 5% of the disk)."""
    home.mkdir(parents=True, exist_ok=True)
    usage = shutil.disk_usage(home)
    reserve = reserve_gb * 2**30 if reserve_gb is not None else max(10 * 2**30, 0.05 * usage.total)
    if usage.free < reserve:
        raise DiskFull(
            f"Only {usage.free / 2**30:.1f} GiB free under {home}, below the reserve of "
            f"{reserve / 2**30:.1f} GiB (disk_reserve_gb); free space or run "
            "`worker-bridge workspaces prune --apply`."
        )
