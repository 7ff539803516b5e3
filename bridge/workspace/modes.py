"""What a worker's files never carry out of its container: set-user-id and set-group-id bits
(cleared) and devices (removed), in the worktree, the private git dir and the CLI home, at
collect.

A worker owns what it writes and may set the set-user-id bit on its own file without any
capability: a copy of an interpreter made 4755 in its worktree is, on the host, a way to run as
the worker's uid (the sandbox uid, or the bridge's own user) for whoever reaches it. The state
root is private and layered checkouts are mounted nosuid and nodev; on top of that, whatever
stays on the host after a turn holds no such bit (full checkouts too), and the snapshot, whose
modes are git's (100644, 100755), never records one. Every entry is reached through folder
descriptors, never following a link; a file's mode is changed through an `O_PATH` descriptor
of the file itself, so a link or a rename in the way changes nothing else."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from bridge.errors import DiskFull
from bridge.workspace import fs

SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID


def disarm(root: Path, entries: Iterable[tuple[str, int]] | None = None) -> list[str]:
    """Clear the set-user-id and set-group-id bits of the regular files under ``root`` and
    remove its devices: those of ``entries`` (relative path, mode: what a snapshot already
    looked at), or every entry found by a walk; the paths changed. What vanished meanwhile or
    cannot be reached is skipped (nobody else reaches it either); a tree too deep to walk
    raises DiskFull, as the snapshot does."""
    if entries is None:
        entries = ((rel, st.st_mode) for rel, st in fs.walk_all(root, strict=False))
    wanted: list[str] = []
    too_deep = None
    try:
        for rel, mode in entries:
            if _armed(mode):
                wanted.append(rel)
    except fs.TreeTooDeep as exc:  # below could not be checked: refused, as collect does
        too_deep = exc  # after what the walk did reach is disarmed
    changed = _disarm_listed(root, wanted) if wanted else []
    if too_deep is not None:
        message = f"The worker made a folder tree too deep to check: {too_deep}."
        raise DiskFull(message) from too_deep
    return changed


def disarm_all(roots: Iterable[tuple[Path, Iterable[tuple[str, int]] | None]]) -> None:
    """`disarm` each of ``roots`` (a folder, and its entries or None for a walk), every one
    of them even when one is too deep to walk; then the first DiskFull, if any."""
    refused: list[DiskFull] = []
    for root, entries in roots:
        try:
            disarm(root, entries)
        except DiskFull as exc:
            refused.append(exc)
    if refused:
        raise refused[0]


def _disarm_listed(root: Path, wanted: list[str]) -> list[str]:
    changed = []
    with fs.OpenDirs(root) as dirs:
        for rel in wanted:
            try:
                parent, name = dirs.parent(rel)
                if _disarm_at(parent, name):
                    changed.append(rel)
            except OSError:
                continue
    return changed


def _armed(mode: int) -> bool:
    if stat.S_ISREG(mode):
        return bool(mode & SPECIAL_BITS)
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def _disarm_at(parent: int, name: str) -> bool:
    """Disarm the entry ``name`` of the folder ``parent``; False when it is harmless."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        st = os.fstat(fd)
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            os.unlink(name, dir_fd=parent)
            return True
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & SPECIAL_BITS:
            return False
        # The file itself, through its descriptor (chmod(2) on the /proc link reaches the inode).
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) & ~SPECIAL_BITS)
        return True
    finally:
        os.close(fd)
