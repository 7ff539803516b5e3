"""Which files a worker run touched, from a stat record taken just before it started.

`git add --all` on a fresh checkout re-hashes every file: git's racy-clean rule (second
granularity) makes every entry written in the same second as the index suspect. We know more
than git here: we record each file's inode, size, mode and nanosecond mtime and ctime right
before the container starts. ctime cannot be set from user space, so a file whose record is
unchanged was not written, and only the touched paths need to go through git.
"""

from __future__ import annotations

import os
from pathlib import Path

Stat = tuple[int, int, int, int, int]  # inode, size, mode, mtime_ns, ctime_ns


def record_files(root: Path) -> dict[str, Stat]:
    """Every file and symlink under ``root`` (relative posix path -> stat), except `.git`."""
    found: dict[str, Stat] = {}
    stack = [("", str(root))]
    while stack:
        prefix, folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                rel = prefix + entry.name
                if not prefix and entry.name == ".git":
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append((rel + "/", entry.path))
                    continue
                st = entry.stat(follow_symlinks=False)
                found[rel] = (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
    return found


def touched_paths(before: dict[str, Stat], after: dict[str, Stat]) -> list[str]:
    """Paths added, removed or changed in any way between two records."""
    changed = {path for path, stat in after.items() if before.get(path) != stat}
    changed |= before.keys() - after.keys()
    return sorted(changed)
