"""Writing an accepted change into the user's working tree: exactly the target tree's blobs, byte
for byte (no attribute-driven conversion), never through a symlink in the user's tree, never over
a file the user has (tracked changes, untracked or ignored files), each blob hashed before it is
written (a damaged object store never reaches the user's files), each written file's identity
kept for the check after writing (`accept.check_written`), and undone when anything fails half
way."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from bridge.workspace import fs
from bridge.workspace.git import Git

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KEEP_OPEN = 64  # folder descriptors the writer keeps open at once


class Entry(NamedTuple):
    """One path of the change: its mode and blob in the target tree, or None to delete it (a
    tuple: a large change has 100,000 of them)."""

    path: str
    mode: str | None
    sha: str | None

    @property
    def delete(self) -> bool:
        return self.mode is None


class Refused(Exception):
    """The change cannot be written; ``kind`` is the accept refusal kind."""

    def __init__(self, message: str, kind: str = "conflict") -> None:
        super().__init__(message)
        self.kind = kind


class BlobReader:
    """Blobs from one `git cat-file --batch` process."""

    def __init__(self, git: Git) -> None:
        self.proc = git.popen("cat-file", "--batch", stdout=True)
        self._feeder: threading.Thread | None = None

    def read(self, sha: str) -> bytes:
        assert self.proc.stdin is not None
        self.proc.stdin.write(sha.encode() + b"\n")
        self.proc.stdin.flush()
        return self._next(sha)

    def stream(self, shas: list[str]) -> Iterator[bytes]:
        """The blobs of ``shas`` in order. A thread writes the names while they are read, so
        there is no round trip per blob (100,000 of them cost seconds)."""
        stdin = self.proc.stdin
        assert stdin is not None

        def feed() -> None:
            try:
                for sha in shas:
                    stdin.write(sha.encode() + b"\n")
                stdin.flush()
            except (BrokenPipeError, ValueError):  # the reader gave up and closed the process
                pass

        self._feeder = threading.Thread(target=feed, name="accept-blobs", daemon=True)
        self._feeder.start()
        for sha in shas:
            yield self._next(sha)

    def _next(self, sha: str) -> bytes:
        assert self.proc.stdout is not None
        header = self.proc.stdout.readline().split()
        if len(header) != 3 or header[1] != b"blob":
            raise Refused(f"Refusing to accept: blob {sha} is missing from the object store.")
        data = self.proc.stdout.read(int(header[2]))
        self.proc.stdout.read(1)
        return data

    def close(self) -> None:
        if self._feeder is not None and self._feeder.is_alive():
            self.proc.kill()  # a stream left half read: the feeder's writes fail and it ends
            self._feeder.join()
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


_HASHES = {"sha1": hashlib.sha1, "sha256": hashlib.sha256}  # the object formats git has


def blob_id(algorithm: str, data: bytes) -> str:
    make = _HASHES.get(algorithm)
    digest = make() if make is not None else hashlib.new(algorithm)
    digest.update(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


class Writer:
    """Applies entries under ``repo`` and can undo what it did (originals are kept in
    ``backup`` until `commit`). Every file is reached through folder descriptors opened
    without following a link (kept open while the paths of one folder are written)."""

    def __init__(
        self, repo: Path, backup: Path, replaceable: set[str] | None = None, *, algorithm: str
    ) -> None:
        self.repo = repo
        self.backup = backup
        self.algorithm = algorithm  # the repository's object format: sha1 or sha256
        # The paths whose files it may replace (the tracked ones the checks saw); any other
        # file in the way appeared after the checks, and is never written over. None: any.
        self.replaceable = replaceable
        self._undo: list[tuple[str, str, Path | None]] = []  # (path, kind, saved copy)
        self._dirs: dict[str, int] = {}  # folder ("" the repository) -> descriptor
        # Each written file's own stat, taken on its descriptor once written:
        # `accept.check_written` finds the very same file there after (a link's target is
        # read again instead, so links have none).
        self.written: dict[str, os.stat_result] = {}

    def apply(self, entries: list[Entry], blobs: BlobReader) -> None:
        self.backup.mkdir(parents=True, exist_ok=True)
        try:
            emptied: set[str] = set()
            for entry in entries:
                if entry.delete and self._remove(entry.path):
                    emptied.add(entry.path.rpartition("/")[0])
            self._remove_empty_folders(emptied)
            writes = [e for e in entries if e.mode is not None]
            blobs_in_order = blobs.stream([e.sha or "" for e in writes])
            for entry, data in zip(writes, blobs_in_order, strict=True):
                self._write(entry, data)
        finally:
            self._close_dirs()

    def _folder(self, folder: str, create: bool) -> int | None:
        """The descriptor of ``folder`` (opened from the nearest open one down, one component
        at a time, never through a link); made where missing when ``create``, else None."""
        if folder in self._dirs:
            return self._dirs[folder]
        if not folder:
            self._dirs[""] = os.open(self.repo, _DIR)
            return self._dirs[""]
        above, _, name = folder.rpartition("/")
        parent = self._folder(above, create)
        if parent is None:
            return None
        try:
            fd = os.open(name, _DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
            os.mkdir(name, 0o777, dir_fd=parent)
            self._undo.append((folder, "mkdir", None))
            fd = os.open(name, _DIR, dir_fd=parent)
        if len(self._dirs) >= _KEEP_OPEN:
            self._close_dirs()  # ``fd`` itself is open on its own
        self._dirs[folder] = fd
        return fd

    def _close_dirs(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()

    def _save(self, parent: int, name: str, st: os.stat_result) -> Path:
        """Keep the user's current file (content and mode) before it is replaced or removed."""
        copy = self.backup / f"{len(self._undo)}"
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=parent), copy)
            return copy
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        with open(fd, "rb") as src, open(copy, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.chmod(copy, stat.S_IMODE(st.st_mode))
        return copy

    def _remove(self, path: str) -> bool:
        """Remove the file at ``path`` (kept for undo); whether there was one."""
        folder, _, last = path.rpartition("/")
        parent = self._folder(folder, create=False)
        if parent is None:
            return False
        name = last
        st = lstat_at(parent, name)
        if st is None or stat.S_ISDIR(st.st_mode):
            return False
        self._undo.append((path, "removed", self._save(parent, name, st)))
        os.unlink(name, dir_fd=parent)
        return True

    def _remove_empty_folders(self, folders: set[str]) -> None:
        """Remove the folders the deletions left empty (and theirs above), each looked at once:
        a folder of 1,000 deleted files is listed once, not 1,000 times."""
        self._close_dirs()  # nothing is written through them after this
        for folder in fs.remove_empty_folders(self.repo, folders):
            self._undo.append((folder, "rmdir", None))

    def _write(self, entry: Entry, data: bytes) -> None:
        if blob_id(self.algorithm, data) != entry.sha:
            raise Refused(
                f"Refusing to accept: the object store gave bytes for blob {entry.sha} that are "
                f"not that blob ('{fs.display(entry.path)}'); it is damaged: run `git fsck`. "
                "Every file was put back."
            )
        folder, _, name = entry.path.rpartition("/")  # names stay str: os encodes them in C
        parent = self._folder(folder, create=True)
        assert parent is not None
        # Most paths of a large change are new: made in place, and only if nothing is there
        # (O_EXCL, no link followed), so nothing that appeared meanwhile is written over.
        self._undo.append((entry.path, "written", None))
        try:
            made = _create(parent, name, entry.mode, data)
            if made is not None:
                self.written[entry.path] = made
            return
        except FileExistsError:
            self._undo.pop()  # not ours: undo must leave it alone
        if self.replaceable is not None and entry.path not in self.replaceable:
            raise self._appeared(entry.path)
        # A file of the user's is replaced whole: kept, then a temporary file renamed over it.
        st = lstat_at(parent, name)
        saved = self._save(parent, name, st) if st is not None else None
        self._undo.append((entry.path, "written", saved))
        tmp = f".wb-accept-{os.urandom(6).hex()}"
        try:
            made = _create(parent, tmp, entry.mode, data)
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            if made is not None:  # a rename changes the file's ctime: its stat again, if ours
                moved = lstat_at(parent, name)
                if moved is None or (moved.st_dev, moved.st_ino) != (made.st_dev, made.st_ino):
                    raise self._appeared(entry.path)
                self.written[entry.path] = moved
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            raise

    def _appeared(self, path: str) -> Refused:
        return Refused(
            f"Refusing to accept: '{fs.display(path)}' appeared in {self.repo} while the "
            "change was being written; every file was put back."
        )

    def undo(self) -> None:
        """Put back every file as it was, newest action first. Backups are copied back (the
        state root may be on another filesystem than the repository); if any could not be,
        the backups are kept and Refused says where."""
        self._close_dirs()
        failed = []
        for path, kind, saved in reversed(self._undo):
            target = self.repo / path
            try:
                if kind == "mkdir":
                    target.rmdir()
                elif kind == "rmdir":
                    target.mkdir(exist_ok=True)
                else:
                    if kind == "written" and os.path.lexists(target):
                        target.unlink()
                    if saved is not None:
                        _restore(saved, target)
            except OSError as exc:
                failed.append(f"{fs.display(path)} ({exc.strerror or exc})")
        if failed:
            raise Refused(
                f"Refusing to accept, and {len(failed)} file(s) could not be put back "
                f"({'; '.join(failed[:3])}); their originals are kept in {self.backup}."
            )
        self.commit()

    def commit(self) -> None:
        fs.remove_tree(self.backup)


def lstat_at(parent: int, name: str | bytes) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _create(parent: int, name: str, mode: str | None, data: bytes) -> os.stat_result | None:
    """A new file or link ``name`` in ``parent`` holding ``data``, and a file's stat once
    written (None for a link); FileExistsError when anything is there already (never
    followed)."""
    if mode == "120000":
        os.symlink(data, name, dir_fd=parent)
        return None
    fd = os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o777 if mode == "100755" else 0o666,
        dir_fd=parent,
    )
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return os.fstat(fd)
    finally:
        os.close(fd)


def _restore(saved: Path, target: Path) -> None:
    """Copy a backup back to ``target`` (a link as a link, a file with its mode)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if saved.is_symlink():
        os.symlink(os.readlink(saved), target)
        return
    tmp = target.with_name(f".wb-restore-{os.urandom(6).hex()}")
    with open(saved, "rb") as src, open(tmp, "xb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    os.chmod(tmp, stat.S_IMODE(os.lstat(saved).st_mode))
    os.replace(tmp, target)


def lstat_path(path: Path | str) -> os.stat_result | None:
    """The path's own stat (a link's, not what it points at), or None when it is not there."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
