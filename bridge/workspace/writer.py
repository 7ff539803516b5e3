"""Writing an accepted change into the user's working tree: exactly the target tree's blobs, byte
for byte (no attribute-driven conversion), never through a symlink in the user's tree, never over
a file the user has (tracked changes, untracked or ignored files), checked after writing against
the blobs, and undone when anything fails half way."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bridge.workspace import fs
from bridge.workspace.git import Git

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Entry:
    """One path of the change: its mode and blob in the target tree, or None to delete it."""

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


def target_entries(git: Git, tree: str, paths: Iterable[str]) -> list[Entry]:
    """The entry of each of ``paths`` in ``tree`` (missing there: a deletion)."""
    wanted = set(paths)
    found: dict[str, tuple[str, str]] = {}
    if wanted:
        out = git.run("ls-tree", "-r", "-z", "--full-tree", tree).stdout
        for item in out.split(b"\0"):
            meta, _, raw = item.partition(b"\t")
            path = fs.decode(raw)
            if path in wanted:
                mode, _kind, sha = meta.decode().split()
                found[path] = (mode, sha)
    return [Entry(p, *found[p]) if p in found else Entry(p, None, None) for p in sorted(wanted)]


def dirty_paths(repo: Path) -> set[str]:
    """Paths with uncommitted changes (staged, unstaged or untracked), from one `git status`
    that takes no lock (a killed accept leaves no index.lock behind)."""
    out = (
        Git(repo)
        .run(
            "--no-optional-locks",
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--no-renames",
        )
        .stdout
    )
    return {fs.decode(item[3:]) for item in out.split(b"\0") if len(item) > 3}


def tracked_paths(repo: Path) -> set[str]:
    """Paths the user's index tracks."""
    out = Git(repo).run("--no-optional-locks", "ls-files", "-z").stdout
    return {fs.decode(item) for item in out.split(b"\0") if item}


def check_entries(repo: Path, entries: list[Entry], dirty: set[str], tracked: set[str]) -> None:
    """Refused naming the first path that must not be written: one with uncommitted changes,
    one that exists but is not tracked (untracked or ignored: the user's own file, such as a
    `.env`), one under a symlink or a file of the user's, or one outside the repository."""
    deleted = {e.path for e in entries if e.delete}
    for entry in entries:
        parts = entry.path.split("/")
        if entry.path.startswith("/") or ".." in parts or any(p.lower() == ".git" for p in parts):
            where = fs.display(entry.path)
            raise Refused(
                f"Refusing to accept: '{where}' is not a path inside the repository.",
                "symlink_escape",
            )
        if entry.path in dirty:
            raise Refused(
                f"Refusing to accept: '{fs.display(entry.path)}' has uncommitted changes in "
                f"{repo}; commit or stash them, then accept again."
            )
        here = repo
        for i, part in enumerate(parts[:-1]):
            here = here / part
            st = _lstat(here)
            if st is None:
                break
            if stat.S_ISLNK(st.st_mode):
                raise Refused(
                    f"Refusing to accept: '{fs.display('/'.join(parts[: i + 1]))}' is a symlink in "
                    f"{repo}, and writing '{fs.display(entry.path)}' would go through it.",
                    "symlink_escape",
                )
            if not stat.S_ISDIR(st.st_mode) and "/".join(parts[: i + 1]) not in deleted:
                raise Refused(
                    f"Refusing to accept: '{fs.display('/'.join(parts[: i + 1]))}' is a file in "
                    f"{repo}, where the change needs a folder."
                )
        st = _lstat(repo / entry.path)
        if st is not None and not stat.S_ISDIR(st.st_mode) and entry.path not in tracked:
            raise Refused(
                f"Refusing to accept: '{fs.display(entry.path)}' exists in {repo} but is not "
                "tracked (an untracked or ignored file of yours); move it away, then accept again."
            )
        if not entry.delete and entry.path not in deleted:
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise Refused(
                    f"Refusing to accept: '{fs.display(entry.path)}' is a folder in {repo}; "
                    "move it away, then accept again."
                )


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


class BlobReader:
    """Blobs from one `git cat-file --batch` process."""

    def __init__(self, git: Git) -> None:
        self.proc = git.popen("cat-file", "--batch", stdout=True)

    def read(self, sha: str) -> bytes:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(sha.encode() + b"\n")
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        if len(header) != 3 or header[1] != b"blob":
            raise Refused(f"Refusing to accept: blob {sha} is missing from the object store.")
        data = self.proc.stdout.read(int(header[2]))
        self.proc.stdout.read(1)
        return data

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


def blob_id(algorithm: str, data: bytes) -> str:
    digest = hashlib.new(algorithm)
    digest.update(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


class Writer:
    """Applies entries under ``repo`` and can undo what it did (originals are kept in
    ``backup`` until `commit`)."""

    def __init__(self, repo: Path, backup: Path) -> None:
        self.repo = repo
        self.backup = backup
        self._undo: list[tuple[str, str, Path | None]] = []  # (path, kind, saved copy)
        self._made_dirs: list[str] = []

    def apply(self, entries: list[Entry], blobs: BlobReader) -> None:
        self.backup.mkdir(parents=True, exist_ok=True)
        for entry in entries:
            if entry.delete:
                self._remove(entry.path)
        for entry in entries:
            if not entry.delete:
                self._write(entry, blobs.read(entry.sha or ""))

    def _save(self, path: str) -> Path | None:
        """Keep the user's current file (content and mode) before it is replaced or removed."""
        target = self.repo / path
        st = _lstat(target)
        if st is None:
            return None
        copy = self.backup / f"{len(self._undo)}"
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(target), copy)
        else:
            with open(target, "rb") as src, open(copy, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            os.chmod(copy, stat.S_IMODE(st.st_mode))
        return copy

    def _remove(self, path: str) -> None:
        target = self.repo / path
        st = _lstat(target)
        if st is None or stat.S_ISDIR(st.st_mode):
            return
        self._undo.append((path, "removed", self._save(path)))
        target.unlink()
        folder = target.parent
        while folder != self.repo and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            self._undo.append((str(folder.relative_to(self.repo)), "rmdir", None))
            folder = folder.parent

    def _write(self, entry: Entry, data: bytes) -> None:
        parent_fd = self._open_parents(entry.path)
        name = os.fsencode(entry.path.rsplit("/", 1)[-1])
        tmp = b".wb-accept-" + os.urandom(6).hex().encode()
        try:
            self._undo.append((entry.path, "written", self._save(entry.path)))
            if entry.mode == "120000":
                os.symlink(data, tmp, dir_fd=parent_fd)
            else:
                mode = 0o777 if entry.mode == "100755" else 0o666
                fd = os.open(
                    tmp,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    mode,
                    dir_fd=parent_fd,
                )
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
            os.rename(tmp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent_fd)
            except OSError:
                pass
            raise
        finally:
            os.close(parent_fd)

    def _open_parents(self, path: str) -> int:
        """The folder of ``path`` opened component by component (made where missing), never
        through a symlink."""
        fd = os.open(self.repo, _DIR)
        done = []
        for part in path.split("/")[:-1]:
            done.append(part)
            raw = os.fsencode(part)
            try:
                nxt = os.open(raw, _DIR, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(raw, 0o777, dir_fd=fd)
                self._undo.append(("/".join(done), "mkdir", None))
                nxt = os.open(raw, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd

    def undo(self) -> None:
        """Put back every file as it was, newest action first. Backups are copied back (the
        state root may be on another filesystem than the repository); if any could not be,
        the backups are kept and Refused says where."""
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


def check_written(repo: Path, entries: list[Entry], algorithm: str, limit: int) -> str | None:
    """The first path whose file is not the target blob (or still exists when deleted)."""
    with fs.OpenDirs(repo) as dirs:
        for entry in entries:
            try:
                if entry.delete:
                    if _lstat(repo / entry.path) is not None and not (repo / entry.path).is_dir():
                        return entry.path
                    continue
                if entry.mode == "120000":
                    data = fs.read_link(dirs, entry.path)
                else:
                    data = fs.read_regular(dirs, entry.path, limit)
                    executable = bool(os.lstat(repo / entry.path).st_mode & stat.S_IXUSR)
                    if executable != (entry.mode == "100755"):
                        return entry.path
                if blob_id(algorithm, data) != entry.sha:
                    return entry.path
            except OSError:
                return entry.path
    return None
