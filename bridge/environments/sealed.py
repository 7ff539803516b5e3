"""Sealed views: an environment view's files (`shared_view`) as one read-only EROFS image,
mounted over the view's tree, so that a later task checks them by the image file's identity
(one lstat) instead of a stat of every cached file (0.18 s of CPU at 50,000 files).

A view is sealed only after its entry's files passed the whole check (`FilesCheck`) in the
task that seals it, and only by root where `mkfs.erofs` and the kernel's erofs are there. The
image is made from the view as it was then, and it is the host's (root-owned, mode 0400, under
the private `bases/` folder); any write to it, a chmod, a rename over it changes its change
time, which no one can set back, so an identity equal to the one recorded when it was made
means the image made then. The mount is checked at each use as well: the mount a path at the
tree reaches must be erofs on a loop device whose backing file is that image. Nothing can write
through it: the filesystem has no write path.
Where sealing fails (no loop devices in a container, say), the view is marked and stays as it
was: its entry is checked whole at each use, as everywhere sealing is not available.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from bridge.host.mountinfo import mounts
from bridge.workspace import overlay

IMAGE = "image.erofs"
SEAL = "seal.json"
UNSEALABLE = "unsealable"  # why sealing failed here once: never tried again for this view
# Not st_dev: some filesystems number their devices anew at each boot.
_IDENTITY = ("st_ino", "st_mode", "st_uid", "st_size", "st_mtime_ns", "st_ctime_ns")
_MOUNT_OPTIONS = "ro,loop,nodev,nosuid"
MOUNT_TIMEOUT_S = 60  # the `mount` command (it sets up the loop device) past this: undone, refused
_TIMEOUT_S = 300


class SealBroken(OSError):
    """A sealed view whose image is not the one sealed (one phrase, as `check_entry`'s)."""


def sealing_available() -> bool:
    """Whether this process could seal a view: root, `mkfs.erofs` on PATH, erofs in the kernel."""
    if os.geteuid() != 0 or shutil.which("mkfs.erofs") is None:
        return False
    try:
        return "\terofs\n" in Path("/proc/filesystems").read_text()
    except OSError:
        return False


def is_sealed(folder: Path) -> bool:
    return (folder / SEAL).is_file()


def seal_image(folder: Path, locked: Callable[[], AbstractContextManager[object]]) -> str | None:
    """Seal the ready view in ``folder`` (its tree just checked whole) and mount the image over
    its tree. Returns why it could not, or None. The image is written outside ``locked`` (the
    bases lock: 0.6 s at 50,000 files, which no other task's pick should wait for) and put in
    place under it. A view already sealed, or marked unsealable, is left as it is."""
    if not _wanted(folder):
        return None
    for stale in folder.glob(f".{IMAGE}.*.tmp"):  # a killed sealer's: past its mkfs's timeout
        if time.time() - stale.lstat().st_mtime > _TIMEOUT_S:
            stale.unlink(missing_ok=True)
    tmp = folder / f".{IMAGE}.{os.getpid()}-{os.urandom(3).hex()}.tmp"
    try:
        _build(folder / "tree", tmp)
        with locked():
            if not (folder / "ready").is_file() or not _wanted(folder):
                return None  # pruned, or sealed by another process meanwhile
            try:
                os.rename(tmp, folder / IMAGE)
                _write_record(folder / SEAL, _identity(os.lstat(folder / IMAGE)))
                _mount(folder)
            except (OSError, subprocess.SubprocessError) as exc:
                return _unsealable(folder, exc)
    except (OSError, subprocess.SubprocessError) as exc:
        with locked():
            return _unsealable(folder, exc) if (folder / "ready").is_file() else None
    finally:
        tmp.unlink(missing_ok=True)
    return None


def _wanted(folder: Path) -> bool:
    return not is_sealed(folder) and not (folder / UNSEALABLE).exists() and sealing_available()


def _build(tree: Path, image: Path) -> None:
    """``tree`` written into the EROFS image ``image``: root's, mode 0400, on disk."""
    # No xattrs (a file capability is never carried), every file's own mtime kept.
    command = ["mkfs.erofs", "--quiet", "--preserve-mtime", "-x-1", str(image), str(tree)]
    proc = subprocess.run(command, capture_output=True, timeout=_TIMEOUT_S)
    if proc.returncode != 0:
        raise OSError(f"mkfs.erofs failed: {proc.stderr.decode(errors='replace').strip()}")
    os.chmod(image, 0o400)
    fd = os.open(image, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unsealable(folder: Path, exc: BaseException) -> str:
    """Undo a seal half made, and mark the view so that it is not tried again: why."""
    why = str(exc) or type(exc).__name__
    overlay.unmount(folder / "tree")
    for name in (SEAL, IMAGE):
        (folder / name).unlink(missing_ok=True)
    (folder / UNSEALABLE).write_text(why + "\n")
    return why


def sealed_tree(folder: Path) -> Path:
    """The sealed view's tree, its image checked and mounted over it (mounted again where the
    mount is gone: a reboot). SealBroken when the image is not the one sealed; OSError when it
    cannot be mounted."""
    tree, image = folder / "tree", folder / IMAGE
    try:
        recorded = json.loads((folder / SEAL).read_text())
        found = _identity(os.lstat(image))
    except (OSError, ValueError):
        raise SealBroken("its sealed image is gone or unreadable") from None
    if found != recorded:
        raise SealBroken("its sealed image changed since it was made")
    if _backing(tree) != overlay.real(image):
        overlay.unmount(tree)  # whatever is mounted there, stacked mounts and all
        _mount(folder)
    return tree


def _mount(folder: Path) -> None:
    tree, image = folder / "tree", folder / IMAGE
    command = ["mount", "-t", "erofs", "-o", _MOUNT_OPTIONS, overlay.real(image)]
    command.append(overlay.real(tree))
    try:
        proc = subprocess.run(command, capture_output=True, timeout=MOUNT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        overlay.unmount(tree)
        raise OSError("the sealed image's mount did not finish in time") from None
    if proc.returncode != 0:
        raise OSError(f"the sealed image's mount failed: {proc.stderr.decode(errors='replace')}")
    if _backing(tree) != overlay.real(image):
        overlay.unmount(tree)
        raise OSError("the sealed image's mount is not of its image")


def _backing(tree: Path) -> str | None:
    """The backing file of the mount a path at ``tree`` reaches, when it is erofs on a loop
    device (the one of the mounts there whose device the tree's own stat gives)."""
    point = overlay.real(tree)
    try:
        st = os.stat(point)
    except OSError:
        return None
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    top = [m for m in mounts() if m.point == point and m.dev == dev]
    if len(top) != 1 or top[0].fstype != "erofs" or not top[0].source.startswith("/dev/loop"):
        return None
    device = top[0].source.removeprefix("/dev/")
    try:
        text = Path(f"/sys/block/{device}/loop/backing_file").read_text()
    except OSError:
        return None
    return text.rstrip("\n")


def _identity(st: os.stat_result) -> list[int]:
    return [int(getattr(st, name)) for name in _IDENTITY]


def _write_record(path: Path, identity: list[int]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(identity))
    os.rename(tmp, path)
