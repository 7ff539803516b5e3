"""The mount table of this process's mount namespace (`/proc/self/mountinfo`), read in one
place: each mount's device, mount point, propagation, filesystem type, source and options,
the kernel's escapes undone. Layered checkouts, sealed views and the pool's shared folders all
read it from here, and ask whether a path is a mount point (`is_mount_point`) without it.
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes

_OCTAL = frozenset("01234567")


@dataclass(frozen=True)
class Mount:
    dev: str  # major:minor, as a stat of a path on it gives st_dev
    point: str
    propagation: tuple[str, ...]  # the optional fields: shared:N, master:N, unbindable
    fstype: str
    source: str
    options: str  # the superblock's, as the kernel gives them (escaped)


def mounts() -> list[Mount]:
    """Every mount of this mount namespace, in mountinfo's order (not always the order they
    stack in: the one a path reaches is the one whose `dev` its stat gives); none where the
    table cannot be read."""
    try:
        return parse(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return []


def mount_points(under: Path | None = None) -> set[str]:
    """Mount points of this mount namespace (all, or those at or under ``under``)."""
    found = {m.point for m in mounts()}
    if under is None:
        return found
    prefix = f"{under}/"
    return {p for p in found if p == str(under) or p.startswith(prefix)}


def is_mount_point(point: str) -> bool:
    """Whether a mount is rooted at ``point`` (a path with no link in it, as mountinfo names
    mount points) in this mount namespace: statx(2)'s mount-root attribute, a few µs, where
    reading the table costs ~5 µs per mount and every task kept unaccepted keeps one; the
    table where the kernel (before Linux 5.8) or the C library (glibc before 2.28) cannot say."""
    import ctypes

    statx = getattr(libc(), "statx", None)
    if statx is not None:
        buf = ctypes.create_string_buffer(256)  # struct statx
        flags = _AT_SYMLINK_NOFOLLOW | _AT_NO_AUTOMOUNT
        if statx(_AT_FDCWD, os.fsencode(point), flags, 0, buf) == 0:
            attributes, known = (int.from_bytes(buf.raw[a : a + 8], sys.byteorder) for a in (8, 56))
            if known & _STATX_ATTR_MOUNT_ROOT:
                return bool(attributes & _STATX_ATTR_MOUNT_ROOT)
        elif ctypes.get_errno() in (errno.ENOENT, errno.ENOTDIR):
            return False
    return point in mount_points()


_AT_FDCWD, _AT_SYMLINK_NOFOLLOW, _AT_NO_AUTOMOUNT = -100, 0x100, 0x800
_STATX_ATTR_MOUNT_ROOT = 0x2000
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8


def unmount_point(point: str, *, lazy: bool = False) -> int:
    """umount2(2) of ``point``, never following a link at the point itself (``lazy``:
    detached at once, undone when nothing has it open: `umount -l`); 0, or the errno."""
    import ctypes

    flags = _UMOUNT_NOFOLLOW | (_MNT_DETACH if lazy else 0)
    return 0 if libc().umount2(os.fsencode(point), flags) == 0 else ctypes.get_errno()


@cache
def libc() -> ctypes.CDLL:
    """The C library, errno kept (`ctypes.get_errno`): mount system calls made directly."""
    import ctypes

    found = ctypes.CDLL(None, use_errno=True)
    found.syscall.restype = ctypes.c_long
    return found


def parse(text: str) -> list[Mount]:
    found = []
    for line in text.splitlines():
        own, sep, rest = line.partition(" - ")
        fields, sb = own.split(" "), rest.split(" ")
        if sep and len(fields) >= 6 and len(sb) >= 3:
            point, source = unescape(fields[4]), unescape(sb[1])
            found.append(Mount(fields[2], point, tuple(fields[6:]), sb[0], source, sb[2]))
    return found


def unescape(text: str) -> str:
    """``text`` with the kernel's escapes undone: a backslash and exactly three octal digits
    (a space, tab, newline or backslash in a path); anything else is kept as it is."""
    if "\\" not in text:
        return text  # nearly every field: read per mount, several times per task
    out, i = [], 0
    while i < len(text):
        code = text[i + 1 : i + 4]
        if text[i] == "\\" and len(code) == 3 and set(code) <= _OCTAL:
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
