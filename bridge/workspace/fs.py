"""Host-side file access to folders a container wrote (worktrees, verification checkouts), safe
against whatever the worker left there: nothing here follows a symlink, opens a FIFO, socket or
device, reads more than it was told to, or depends on PATH_MAX or on Python's recursion limit.
Walks and removals go directory by directory through file descriptors; names are bytes, turned
into `str` with surrogateescape (so names that are not UTF-8 survive the round trip)."""

from __future__ import annotations

import errno
import heapq
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MAX_DEPTH = 4096  # directories deeper than this are not walked (the walk says so)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_FLATTEN_AT = 200  # open directory descriptors a removal keeps before it flattens the tree


class TreeTooDeep(OSError):
    """A directory tree deeper than MAX_DEPTH."""


def decode(name: bytes) -> str:
    return os.fsdecode(name)


def decode_fields(raw: bytes) -> list[str]:
    """The NUL-separated fields of git's `-z` output, decoded in one call: the same strings as
    `decode` of each (no character of a file system encoding holds a NUL byte, and an
    undecodable byte is escaped on its own either way), without a call per name."""
    return raw.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()).split("\0")


def encode(path: str) -> bytes:
    return os.fsencode(path)


def display(path: str) -> str:
    """A path as people and JSON see it: bytes that are not UTF-8 shown as \\xNN escapes."""
    if path.isascii():  # nearly every path: the same string, without encoding it twice
        return path
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def walk(root: Path, *, skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``root`` except directories (files, symlinks, special files), as
    (relative path, lstat), depth first; top-level names in ``skip`` are left out."""
    for path, st in walk_all(root, skip=skip):
        if not stat.S_ISDIR(st.st_mode):
            yield path, st


def walk_all(
    root: Path, *, skip: frozenset[str] = frozenset(), strict: bool = True
) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``root``, directories included (each before its contents). With
    ``strict`` off, a folder that cannot be opened is yielded but not entered, and the walk
    goes on (for measuring); with it on, that raises. Deeper than MAX_DEPTH raises either way."""
    top = os.open(root, _DIR_FLAGS)
    stack: list[tuple[int, bytes, list[bytes]]] = [(top, b"", _subdirs_first(top))]
    try:
        while stack:
            fd, prefix, names = stack[-1]
            if not names:
                os.close(fd)
                stack.pop()
                continue
            name = names.pop()
            if not prefix and decode(name) in skip:
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            rel = prefix + name
            yield decode(rel), st
            if not stat.S_ISDIR(st.st_mode):
                continue
            if len(stack) >= MAX_DEPTH:  # even when measuring: depth is a limit of its own
                raise TreeTooDeep(
                    f"'{display(decode(rel))[:120]}...' is over {MAX_DEPTH} levels deep"
                )
            try:
                child = _open_listable(fd, name, st)
            except OSError:
                if strict:
                    raise
                continue
            try:
                names_below = _subdirs_first(child)
            except OSError:
                os.close(child)
                if strict:
                    raise
                continue
            stack.append((child, rel + b"/", names_below))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _open_listable(parent: int, name: bytes, st: os.stat_result) -> int:
    """Open a directory for listing; one of ours the worker made unreadable (`chmod 000`, as
    the same uid when the bridge is not root) gets its owner's rwx back first."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        if st.st_uid != os.geteuid():
            raise
        os.chmod(name, stat.S_IMODE(st.st_mode) | 0o700, dir_fd=parent)
        return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _subdirs_first(fd: int) -> list[bytes]:
    """The names in a directory (popped from the end: the listing order does not matter)."""
    with os.scandir(fd) as entries:
        return [os.fsencode(entry.name) for entry in entries]


def tree_size(roots: list[Path]) -> int:
    """Bytes of disk used under ``roots`` (each inode counted once, hard links included).
    TreeTooDeep when a tree is too deep to measure (which is itself over a limit)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in roots:
        if not os.path.isdir(root):
            continue
        try:
            for _, st in walk_all(root, strict=False):
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += st.st_blocks * 512
        except TreeTooDeep:
            raise
        except OSError:
            continue  # the root itself went away meanwhile
    return total


@dataclass
class OpenDirs:
    """Directories opened component by component from a root, never through a symlink, with
    the last few kept open (walking many files of one folder opens it once). Names stay
    `str`: the os functions encode them as `encode` would, without a Python call per name."""

    root: Path
    keep: int = 64
    _fds: dict[str, int] = field(default_factory=dict)

    def __enter__(self) -> OpenDirs:
        self._fds[""] = os.open(self.root, _DIR_FLAGS)
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def parent(self, rel: str) -> tuple[int, str]:
        """(fd of the directory holding ``rel``, its last name); OSError (ELOOP, ENOTDIR) when a
        component on the way is a symlink or not a directory."""
        folder, _, name = rel.rpartition("/")
        return self._dir(folder), name

    def _dir(self, folder: str) -> int:
        """Open ``folder`` from its nearest open ancestor down, one component at a time."""
        if folder in self._fds:
            return self._fds[folder]
        parts = folder.split("/")
        known = len(parts)
        while known > 0 and "/".join(parts[:known]) not in self._fds:
            known -= 1
        fd = self._fds["/".join(parts[:known])] if known else self._fds[""]
        opened = None
        for i in range(known, len(parts)):
            nxt = os.open(parts[i], _DIR_FLAGS, dir_fd=fd)
            if opened is not None:
                os.close(opened)
            fd = opened = nxt
        if len(self._fds) > self.keep:
            victim = next(k for k in self._fds if k != "")
            os.close(self._fds.pop(victim))
        self._fds[folder] = fd
        return fd


def read_regular(dirs: OpenDirs, rel: str, limit: int) -> bytes:
    """The bytes of the regular file ``rel`` (at most ``limit``); OSError when it is anything
    else (a FIFO is never opened for reading: O_NONBLOCK, and fstat is checked first)."""
    fd_dir, name = dirs.parent(rel)
    fd = os.open(name, _FILE_FLAGS, dir_fd=fd_dir)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"'{display(rel)}' is not a regular file")
        if st.st_size > limit:
            raise OSError(f"'{display(rel)}' is larger than {limit} bytes")
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_link(dirs: OpenDirs, rel: str) -> bytes:
    fd_dir, name = dirs.parent(rel)
    return os.fsencode(os.readlink(name, dir_fd=fd_dir))


def read_small(path: Path, limit: int = 65536) -> bytes:
    """A small regular file at a path whose folders are ours (never following a final link)."""
    fd = os.open(path, _FILE_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise OSError(f"{path} is not a regular file of at most {limit} bytes")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> list[str]:
    """Remove ``path`` and everything under it, however deep, never following a link. Folders
    made unreadable are made readable first. Returns what could not be removed (one line each),
    having removed everything else."""
    failures: list[str] = []
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return failures
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(path)
        except OSError as exc:
            failures.append(f"{path}: {exc.strerror}")
        return failures
    parent = os.open(path.parent, _DIR_FLAGS)
    try:
        _remove_dir(parent, os.fsencode(path.name), path, failures)
    finally:
        os.close(parent)
    return failures


# A folder being removed: (fd, name in the directory above, names in it that could not be
# removed, entries still to look at, whether the folder was listed again once those ran out).
_Frame = tuple[int, bytes, set[bytes], list[tuple[bytes, bool]], list[bool]]


def _remove_dir(parent: int, name: bytes, where: Path, failures: list[str]) -> None:
    """Empty and remove ``name`` in ``parent``. Each folder is listed once, and once more when
    its listing is used up (to catch what was moved into it), so a wide folder costs linear
    time; an entry the listing says is not a folder is unlinked without a stat first (as
    `rm -r` does), and one that turns out to be a folder after all is entered. Deep trees are
    flattened: past _FLATTEN_AT open levels, the next directory down is moved up into
    ``name`` and removed from there, so the descriptors held stay bounded however deep the
    tree is. What another process removes meanwhile is taken as removed."""
    try:
        top = _open_for_removal(parent, name)
    except FileNotFoundError:
        return
    except OSError as exc:
        failures.append(f"{where}: {exc.strerror}")
        return
    tag = os.urandom(4).hex().encode()
    flat = 0
    stack: list[_Frame] = [(top, name, set(), _removal_listing(top), [False])]
    while stack:
        fd, here, stuck, pending, relisted = stack[-1]
        child: _Frame | None = None
        while pending:
            entry, listed_as_dir = pending.pop()
            if entry in stuck:
                continue
            try:
                if not listed_as_dir and _unlinked(fd, entry):
                    continue
                if len(stack) >= _FLATTEN_AT:
                    # Moved up into the folder being removed (never beside it), where the walk
                    # meets it again; an interrupted removal leaves nothing outside it.
                    flat += 1
                    os.rename(entry, b".wb-flat-%s-%d" % (tag, flat), src_dir_fd=fd, dst_dir_fd=top)
                    continue
                try:
                    sub = _open_for_removal(fd, entry)
                except (NotADirectoryError, _Link):  # a file or a link after all
                    os.unlink(entry, dir_fd=fd)
                    continue
                child = (sub, entry, set(), _removal_listing(sub), [False])
                break
            except FileNotFoundError:
                continue
            except OSError as exc:
                stuck.add(entry)
                failures.append(f"{where} (…/{display(decode(entry))}): {exc.strerror}")
        if child is not None:
            stack.append(child)
            continue
        # What was moved in meanwhile is seen now: flattened folders land in the top one
        # (listed again until none come back), nothing moves into the others (once is enough).
        if not relisted[0] or len(stack) == 1:
            relisted[0] = True
            pending.extend(e for e in _removal_listing(fd) if e[0] not in stuck)
            if pending:
                continue
        os.close(fd)
        stack.pop()
        up = stack[-1] if stack else None
        try:
            os.rmdir(here, dir_fd=up[0] if up else parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if up is not None:
                up[2].add(here)
            failures.append(f"{where} (…/{display(decode(here))}): {exc.strerror}")


class _Link(OSError):
    """A symlink where a directory was opened for removal."""


def _unlinked(fd: int, entry: bytes) -> bool:
    """Unlink ``entry`` (not a folder when it was listed); False when it is a folder now."""
    try:
        os.unlink(entry, dir_fd=fd)
    except IsADirectoryError:
        return False
    return True


def _removal_listing(fd: int) -> list[tuple[bytes, bool]]:
    """(name, whether the listing's file type says folder) for each entry, to be popped from
    the end in the order the directory lists them. The type comes with the listing on ext4,
    xfs, btrfs and tmpfs; where it does not, scandir asks lstat."""
    with os.scandir(fd) as entries:
        found = [(os.fsencode(e.name), e.is_dir(follow_symlinks=False)) for e in entries]
    found.reverse()
    return found


def _open_for_removal(parent: int, name: bytes) -> int:
    """Open a directory to empty it. One the worker made unreadable or unwritable (chmod 000)
    gets its owner's rwx back first. NotADirectoryError or _Link when ``name`` is a file or a
    symlink (never followed)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            raise
        os.chmod(name, 0o700, dir_fd=parent)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Link(exc.errno, exc.strerror) from exc
        raise
    if os.fstat(fd).st_mode & 0o700 != 0o700:
        try:
            os.fchmod(fd, 0o700)
        except OSError:
            pass  # not ours to change: the removal reports what stays
    return fd


def remove_empty_folders(root: Path, folders: set[str]) -> list[str]:
    """Remove those of ``folders`` (paths under ``root``) left empty, and their parents left
    empty in turn, deepest first, each looked at once however many deletions emptied it; never
    through a link. Returns the folders removed, in order."""
    heap = [(-f.count("/"), f) for f in folders if f]
    heapq.heapify(heap)
    seen: set[str] = set()
    removed = []
    while heap:
        _, folder = heapq.heappop(heap)
        if folder in seen:
            continue
        seen.add(folder)
        path = root / folder
        if path.is_symlink() or not path.is_dir() or any(path.iterdir()):
            continue
        path.rmdir()
        removed.append(folder)
        above = folder.rpartition("/")[0]
        if above:
            heapq.heappush(heap, (-above.count("/"), above))
    return removed


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Hand a tree the host just made (before any container saw it) to uid:gid, links
    included and never followed: `chown -R -h` (about 5x faster than a walk from Python)."""
    chown = shutil.which("chown")
    if chown is not None:
        proc = subprocess.run(
            [chown, "-R", "-h", f"{uid}:{gid}", "--", str(root)], capture_output=True
        )
        if proc.returncode == 0:
            return
    os.lchown(root, uid, gid)
    for path, _ in walk_all(root):
        os.lchown(root / path, uid, gid)
