"""Host-side bind mounts for the container pool, through Linux's mount API (libc's `syscall`):
a clone of the source tree, made read-only *before* it is attached (the flag a mount has when
it is attached is what propagates into a container; a later remount would not), then moved
onto a point opened without following any link, so nothing a sandbox wrote on the way (a
link planted where a mount goes) can lead a host mount elsewhere. Root only, Linux ≥ 5.12."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from pathlib import Path

from bridge.host.mountinfo import is_mount_point, mounts, unmount_point
from bridge.host.mountinfo import libc as _libc

_OPEN_TREE, _MOVE_MOUNT, _MOUNT_SETATTR = 428, 429, 442  # x86_64 and arm64 alike
_OPEN_TREE_CLONE, _O_CLOEXEC, _AT_RECURSIVE, _AT_EMPTY_PATH = 1, 0o2000000, 0x8000, 0x1000
_MOVE_F_EMPTY, _MOVE_T_EMPTY = 0x4, 0x40
_ATTR_RDONLY, _ATTR_NOSUID, _ATTR_NODEV = 0x1, 0x2, 0x4
_MS_BIND, _MS_PRIVATE, _MS_SHARED = 4096, 1 << 18, 1 << 20
_AT_FDCWD = -100


class _Attr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def attach(source: Path, point: int, *, read_only: bool) -> None:
    """Bind ``source`` (recursively) onto the open point ``point`` (an O_PATH descriptor);
    nosuid and nodev always, read-only when asked, and private (as the engine's own binds):
    a clone of a shared mount would be a peer of it, so a mount made under the point later
    (a nested mount of the task) would appear at ``source`` on the host too, and one the
    host makes under ``source`` would reach the container; all before it is visible."""
    libc = _libc()
    tree = _check(
        libc.syscall(
            _OPEN_TREE,
            _AT_FDCWD,
            os.fsencode(source),
            _OPEN_TREE_CLONE | _O_CLOEXEC | _AT_RECURSIVE,
        ),
        f"clone the mount tree of {source}",
    )
    try:
        flags = _ATTR_NOSUID | _ATTR_NODEV | (_ATTR_RDONLY if read_only else 0)
        attr = _Attr(flags, 0, _MS_PRIVATE, 0)
        _check(
            libc.syscall(
                _MOUNT_SETATTR,
                tree,
                b"",
                _AT_EMPTY_PATH | _AT_RECURSIVE,
                ctypes.byref(attr),
                ctypes.sizeof(attr),
            ),
            f"set the flags of a mount of {source}",
        )
        _check(
            libc.syscall(_MOVE_MOUNT, tree, b"", point, b"", _MOVE_F_EMPTY | _MOVE_T_EMPTY),
            f"attach a mount of {source}",
        )
    finally:
        os.close(tree)


def open_point(root: Path, rel: str = "", kind: str = "dir") -> int:
    """An O_PATH descriptor of ``root``/``rel`` reached without following a link (``root``
    itself is the host's own folder); missing folders on the way are made (root's, 0755, as
    the engine makes a nested mount's), and a missing last entry as a ``kind`` (an empty file or
    folder). OSError when an entry is a link or of the other kind."""
    fd = os.open(root, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    parts = [p for p in rel.split("/") if p]
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            want_dir = not last or kind == "dir"
            try:
                if want_dir:
                    os.mkdir(part, 0o755, dir_fd=fd)
                else:
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                    os.close(os.open(part, flags, 0o644, dir_fd=fd))
            except FileExistsError:
                pass
            child = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode) != want_dir or not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise OSError(errno.ENOTDIR, f"{root}/{rel}: not a {kind} where a mount goes")
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode) != (kind == "dir"):
            raise OSError(errno.ENOTDIR, f"{root}/{rel}: not a {kind} where a mount goes")
        return fd
    except BaseException:
        os.close(fd)
        raise


def detach(path: Path) -> None:
    """Undo the mount at ``path`` and every mount under it, at once (lazily, for whatever
    still has it open); a path with no mount of its own is left as it is."""
    if not is_mount_point(str(path)):
        return
    code = unmount_point(str(path), lazy=True)
    if code not in (0, errno.EINVAL, errno.ENOENT):
        raise OSError(code, f"unmount {path}: {os.strerror(code)}")


def share(folder: Path) -> None:
    """Make ``folder`` a shared mount of its own (a bind of itself, once, in a peer group of its
    own: made private first, as a bind of a shared mount would be its peer and send every
    slot's mounts to the host's other namespaces), so that mounts made under it reach the
    containers that mount parts of it with `rslave` propagation."""
    if shared(folder):
        return
    libc = _libc()
    if not is_mount_point(str(folder)):
        _check(
            libc.mount(os.fsencode(folder), os.fsencode(folder), None, _MS_BIND, None),
            f"bind {folder}",
        )
    _check(libc.mount(None, os.fsencode(folder), None, _MS_PRIVATE, None), f"isolate {folder}")
    _check(libc.mount(None, os.fsencode(folder), None, _MS_SHARED, None), f"share {folder}")


def shared(folder: Path) -> bool:
    """Whether ``folder`` is a mount point of its own with shared propagation."""
    return any(
        m.point == str(folder) and any(p.startswith("shared:") for p in m.propagation)
        for m in mounts()
    )
