"""Layered checkouts: a task's worktree or verification checkout as an overlay mount made by the
host, whose lower dir is a read-only checkout of the base commit kept once per commit
(`bridge.workspace.bases`) and whose upper dir holds everything the task wrote.

Making one costs a mount, not a write of every file; the upper dir *is* the change set (files
written or copied up, whiteouts for deletions, opaque folders for folders made anew, marked
folders for lower folders renamed), so the snapshot and the disk watchdog look at what changed
instead of walking the whole tree. The kernel never writes a lower dir through an overlay
(writes, links, chmod, renames and deletes all land in the upper dir), and containers only ever
see the merged folder, never the layers.
Where overlay mounts are unavailable (not root, a bridge in a container without the right, a
path the mount options cannot carry), callers fall back to full checkouts.

Every mount here is under the state root and is undone before its folders are removed;
`reclaim_mounts` undoes those whose folders a killed process left behind.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bridge.host.mountinfo import (
    is_mount_point,
    libc,
    mount_points,
    mounts,
    unescape,
    unmount_point,
)
from bridge.workspace import fs

OPAQUE_XATTR = "trusted.overlay.opaque"
REDIRECT_XATTR = "trusted.overlay.redirect"
# redirect_dir on: a folder of the base renamed in place (rename(2), as `git mv` and Python's
# os.rename do) is a folder in the upper dir marked with where its lower files are, instead of
# EXDEV, which only tools that fall back to a copy (`mv`) survive; reading the change set walks
# such a folder in the merged view (`upper_entries`). metacopy off: every other change is a whole
# entry in the upper dir (a chmod copies the data). The kernel alone sets these marks: set
# through a mount they are refused without CAP_SYS_ADMIN and kept escaped even for root.
_OPTIONS = "redirect_dir=on,metacopy=off,index=off"
_UNSAFE = (",", ":", "\\", "\n", "=")
_PAGE = 4096  # what mount(2) reads of its options
_MS_NOSUID, _MS_NODEV = 2, 4
NO_OVERLAY = "this process cannot make overlay mounts (not root, or not allowed to mount)"
MOUNT_SEP = "--"  # <home>/mounts/<task id>--<name>: a mount point outside the task's folders


@dataclass(frozen=True)
class Layers:
    """The folders of one overlay: ``lowers`` (topmost first, read-only), ``root`` holding the
    upper and work dirs, and ``target``, the mount point (the merged view)."""

    lowers: tuple[Path, ...]
    root: Path
    target: Path

    @property
    def upper(self) -> Path:
        return self.root / "upper"

    @property
    def work(self) -> Path:
        return self.root / "work"


def overlay_usable(scratch: Path) -> bool:
    """Whether this process can make overlay mounts with upper dirs under ``scratch`` (asked
    once per process and folder: a real mount of a tiny overlay)."""
    return _probe(real(scratch))  # resolved: a state root through a link is a folder here


@lru_cache(maxsize=16)
def _probe(scratch: str) -> bool:
    if os.geteuid() != 0 or not Path("/proc/self/mountinfo").is_file():
        return False
    root = Path(scratch) / f".overlay-probe-{os.getpid()}"
    layers = Layers((root / "lower",), root / "layers", root / "merged")
    try:
        fs.remove_tree(root)
        for folder in (layers.lowers[0], layers.target):
            folder.mkdir(parents=True)
        (layers.lowers[0] / "f").write_bytes(b"x")
        mount(layers)
        try:
            (layers.target / "f").unlink()  # a whiteout needs the upper fs's xattrs and mknod
            return (layers.lowers[0] / "f").exists() and not os.path.lexists(layers.target / "f")
        finally:
            unmount(layers.target)
    except OSError:
        return False
    finally:
        fs.remove_tree(root)


def mount(layers: Layers, owner: tuple[int, int] | None = None) -> None:
    """Mount ``layers`` at its target (made, with fresh upper and work dirs, when missing; an
    existing upper dir is used again, as after a reboot). The merged root takes the upper dir's
    owner: ``owner`` when given. OSError when the kernel refuses."""
    for folder in (layers.upper, layers.work, layers.target):
        folder.mkdir(parents=True, exist_ok=True)
    if owner is not None:
        os.chown(layers.upper, *owner)
    # Every path resolved (a state root reached through a link): mountinfo names the mount
    # point resolved, and its options as given, and both are compared with `real` paths.
    lowers, upper, work = [real(p) for p in layers.lowers], real(layers.upper), real(layers.work)
    if any(ch in p for p in (*lowers, upper, work) for ch in _UNSAFE):
        raise OSError(f"overlay options cannot name {layers.root}")
    options = f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work},{_OPTIONS}"
    if len(os.fsencode(options)) >= _PAGE:  # mount(2) would cut them at a page, silently
        raise OSError(f"overlay options for {layers.root} are too long for the kernel")
    _mount_overlay(os.fsencode(options), os.fsencode(real(layers.target)))


def _mount_overlay(options: bytes, target: bytes) -> None:
    """mount(2) of an overlay with ``options`` at ``target``: the system call itself (~0.05 ms),
    where the `mount` command costs a process and libmount's reading of the table (2-5 ms),
    two or three times per task. Always nosuid and nodev: what a task writes is a worker's or
    its code's, and its set-user-id bits and devices must mean nothing on the host, even to a
    process that can reach the merged view."""
    if libc().mount(b"overlay", target, b"overlay", _MS_NOSUID | _MS_NODEV, options) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"overlay mount failed: {os.strerror(code)}")


def real(path: Path) -> str:
    """``path`` with every link in it resolved, as mountinfo names mount points."""
    return os.path.realpath(path)


def mounted(target: Path) -> bool:
    return is_mount_point(real(target))


def lower_dirs() -> set[str]:
    """The lower dirs of every overlay mount of this mount namespace (as `mount` named them:
    resolved, see `mount`)."""
    found: set[str] = set()
    for m in mounts():
        if m.fstype != "overlay":
            continue
        for option in m.options.split(","):
            name, _, value = option.partition("=")
            if name in ("lowerdir", "lowerdir+"):
                found.update(unescape(p) for p in value.split(":") if p)
    return found


def unmount(target: Path) -> None:
    """Undo the mounts at ``target`` if there are any (detached lazily when something still
    has one open: a container being removed, a process of ours). Idempotent. By the system
    call (~0.05 ms, where `umount` costs a process, ~2.5 ms, several times per task)."""
    point = real(target)
    for _ in range(8):  # mounts stacked at one point: each taken off in turn
        if not is_mount_point(point):
            return
        if unmount_point(point) and is_mount_point(point):
            unmount_point(point, lazy=True)


def unmount_under(root: Path) -> list[str]:
    """Undo every mount under ``root`` (inner ones first): before a whole state root is
    removed, which would otherwise delete through the merged views and leave the mounts."""
    prefix = f"{real(root)}/"
    points = sorted((p for p in mount_points() if p.startswith(prefix)), reverse=True)
    for point in points:
        unmount(Path(point))
    return points


def mount_point(home: Path, task_id: str, name: str) -> Path:
    """Where a task's checkout named ``name`` is mounted: outside its task folder, so that
    measuring the folder (the disk watchdog) walks the upper dir there and not the merged view."""
    return home / "mounts" / f"{task_id}{MOUNT_SEP}{name}"


def changed_candidates(upper: Path, tracked: Iterable[str]) -> set[str]:
    """Every path that may differ between the merged view and the lower dirs, from the upper dir
    alone: each entry in it, and each lower path under a whiteout, an opaque folder, or a
    non-folder that replaced a folder. A superset: callers compare each one in the merged view.
    Top-level `.git` is not a candidate (it is the host's gitfile)."""
    ordered = sorted(tracked)
    found: set[str] = set()

    def under(prefix: str) -> None:
        start = bisect.bisect_left(ordered, prefix + "/")
        for path in ordered[start:]:
            if not path.startswith(prefix + "/"):
                break
            found.add(path)

    for rel, st in fs.walk_all(upper, skip=frozenset({".git"})):
        found.add(rel)
        if stat.S_ISDIR(st.st_mode):
            if _opaque(upper / rel) or _redirected(upper / rel):
                under(rel)
        else:  # a whiteout, a file or a link: whatever was below it is gone
            under(rel)
    return found


@dataclass
class UpperEntries:
    """The upper dir's entries (but top-level `.git`): ``folders``, plain ones (only their own
    entry may differ below them); ``others``: files, links, whiteouts, opaque and moved folders,
    which hide whatever the lower dirs hold at or under their path; ``moved``, the folders
    renamed in place (their files are lower ones from elsewhere, absent from the upper dir:
    everything under them in the merged view may differ), outermost only."""

    folders: list[str]
    others: list[str]
    moved: list[str]


def upper_entries(upper: Path) -> UpperEntries:
    found = UpperEntries([], [], [])
    for rel, st in fs.walk_all(upper, skip=frozenset({".git"})):
        if not stat.S_ISDIR(st.st_mode) or _opaque(upper / rel):
            found.others.append(rel)
        elif _redirected(upper / rel):
            found.others.append(rel)
            if not any(rel.startswith(f"{m}/") for m in found.moved):  # each before its own
                found.moved.append(rel)
        else:
            found.folders.append(rel)
    return found


def _opaque(folder: Path) -> bool:
    try:
        return os.getxattr(folder, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _redirected(folder: Path) -> bool:
    """Whether ``folder`` (in an upper dir) is a lower folder renamed in place."""
    try:
        return bool(os.getxattr(folder, REDIRECT_XATTR, follow_symlinks=False))
    except OSError:
        return False


def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
