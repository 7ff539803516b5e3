"""Which files a worker run touched, from a stat record taken just before it started.

`git add --all` on a fresh checkout re-hashes every file: git's racy-clean rule (second
granularity) makes every entry written in the same second as the index suspect. We know more
than git here: we record each file's inode, size, mode and nanosecond mtime and ctime right
before the container starts. ctime cannot be set from user space, so a file whose record is
unchanged was not written, and only the touched paths need to go through git.
"""

from __future__ import annotations

from pathlib import Path

from bridge.errors import DiskFull
from bridge.workspace import fs

Stat = tuple[int, int, int, int, int]  # inode, size, mode, mtime_ns, ctime_ns


def record_files(root: Path, limit: int | None = None) -> dict[str, Stat]:
    """Every entry under ``root`` but directories (files, symlinks, special files), as
    relative path -> stat, except the top-level `.git`. Never follows a link; any depth up to
    `fs.MAX_DEPTH`, any name (see `bridge.workspace.fs`). More than ``limit`` entries raise
    DiskFull (limits.files)."""
    found: dict[str, Stat] = {}
    for path, st in fs.walk(root, skip=frozenset({".git"})):
        if limit is not None and len(found) >= limit:
            raise DiskFull(
                f"{root} holds more than {limit} files (limits.files); raise the limit or "
                "narrow the task."
            )
        found[path] = (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
    return found


def touched_paths(before: dict[str, Stat], after: dict[str, Stat]) -> list[str]:
    """Paths added, removed or changed in any way between two records."""
    changed = {path for path, stat in after.items() if before.get(path) != stat}
    changed |= before.keys() - after.keys()
    return sorted(changed)
