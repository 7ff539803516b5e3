"""Storage safety: the free-disk reserve a task must leave under the state root."""

from __future__ import annotations

import shutil
from pathlib import Path

from bridge.errors import DiskFull


def reserve_bytes(home: Path, reserve_gb: float | None) -> float:
    """The reserve: ``reserve_gb``, or by default the larger of 10 GiB and 5% of the disk."""
    if reserve_gb is not None:
        return reserve_gb * 2**30
    return max(10 * 2**30, 0.05 * shutil.disk_usage(home).total)


def check_free_space(home: Path, reserve_gb: float | None) -> None:
    """Raise DiskFull when free space under ``home`` is below the reserve."""
    home.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(home).free
    reserve = reserve_bytes(home, reserve_gb)
    if free < reserve:
        raise DiskFull(
            f"Only {free / 2**30:.1f} GiB free under {home}, below the reserve of "
            f"{reserve / 2**30:.1f} GiB (disk_reserve_gb); free space or run "
            "`worker-bridge workspaces prune --apply`."
        )
