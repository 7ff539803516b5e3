"""The snapshot: the worktree's files, as they are after the worker's turn, committed on the host
to the task branch, with the base commit as parent.

Everything here reads what a worker wrote, so it reads it the safe way and decides itself what
git sees: regular files are read (bounded, never through a link) and symlinks stored as links;
FIFOs, sockets and devices are removed and left out; nested `.git` files, folders and links (an
embedded repository, or a `gitdir:` pointing anywhere on the host) are removed and left out, so
the host's git never follows them; paths inside a submodule are left out. Each one left out is
reported. Sizes are checked against the task's limits before anything is written into the user's
object store. The commit is made by one `git fast-import` (raw bytes, no attribute filters, no
index, linear in the number of changed paths), which writes the branch.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bridge.errors import DiskFull, GitError
from bridge.workspace import fs
from bridge.workspace.baseline import (
    Stat,
    TreeEntry,
    layered_candidates,
    walked_candidates,
)
from bridge.workspace.git import Git, nul_join
from bridge.workspace.modes import disarm
from bridge.workspace.rawgit import object_format
from bridge.workspace.worktree import TaskWorkspace, clear_stale_locks

MAX_PATH_BYTES = 3072  # a longer path would not check out under a verification folder
STOP_EVERY = 500  # paths read between two calls of the stop check


@dataclass(frozen=True)
class Dropped:
    path: str
    reason: str

    def document(self) -> dict[str, str]:
        return {"path": fs.display(self.path), "reason": self.reason}


@dataclass(frozen=True)
class SnapshotLimits:
    file_bytes: int
    change_bytes: int
    entries: int = 500_000  # files, links and others the worktree may hold


@dataclass
class Snapshot:
    commit: str
    dropped: list[Dropped] = field(default_factory=list)


def snapshot_worktree(
    ws: TaskWorkspace,
    base: str,
    start: str,
    message: str,
    limits: SnapshotLimits,
    baseline: dict[str, Stat] | None = None,
    stop: Callable[[], None] = lambda: None,
    timeout: float = 600,
) -> Snapshot:
    """Commit the worktree to the task branch: the tree of ``start`` (the base, or the previous
    turn's snapshot) changed by what the worker touched since ``baseline`` (every path when
    there is none), with ``base`` as parent. Raises DiskFull when a limit is passed. ``stop``
    is called every STOP_EVERY paths read and may raise to end the work (a cancel, the
    deadline); nothing is committed then."""
    upper = ws.upper
    if upper is not None:  # a layered worktree: its upper dir is the change set
        candidates, current, tracked = layered_candidates(ws, upper, base, start, limits.entries)
    else:
        candidates, current, tracked = walked_candidates(ws, start, limits.entries, baseline)
    # No set-user-id or set-group-id bit stays on the host (bridge/workspace/modes.py): of
    # every file the worker touched, with the stat already taken.
    disarm(ws.worktree, ((p, s[2]) for p, s in current.items() if stat.S_ISREG(s[2])))
    with fs.OpenDirs(ws.worktree) as dirs:
        plan = _Plan(ws, tracked, current, limits, dirs)
        plan.timeout = timeout
        for n, path in enumerate(sorted(candidates)):
            if n % STOP_EVERY == 0:
                stop()
            plan.consider(path)
    plan.drop_from_worktree()
    plan.leave_out_ignored()
    plan.check_limits()
    commit = _fast_import(ws, base, start, message, plan, stop)
    return Snapshot(commit, plan.dropped)


class _Plan:
    """What the snapshot changes relative to the start tree, and what it leaves out."""

    def __init__(
        self,
        ws: TaskWorkspace,
        tracked: dict[str, TreeEntry],
        current: dict[str, Stat],
        limits: SnapshotLimits,
        dirs: fs.OpenDirs,
    ) -> None:
        self.ws, self.tracked, self.current, self.limits = ws, tracked, current, limits
        self.dirs = dirs
        self.gitlinks = {p for p, e in tracked.items() if e.mode == "160000"}
        self.deletes: list[str] = []
        self.writes: dict[str, str] = {}  # path -> mode
        self.dropped: list[Dropped] = []
        self._nested: set[str] = set()
        self._special: list[str] = []
        self.timeout = 600.0
        self._hasher: Callable[[bytes], str] | None = None

    def consider(self, path: str) -> None:
        parts = path.split("/")
        nested = next((i for i, part in enumerate(parts) if is_git_dir_name(part)), None)
        if nested is not None:
            self._nested.add("/".join(parts[: nested + 1]))
            return
        if any("/".join(parts[:i]) in self.gitlinks for i in range(1, len(parts))):
            self.dropped.append(Dropped(path, "inside a submodule"))
            return
        if len(fs.encode(path)) > MAX_PATH_BYTES:
            raise DiskFull(
                f"The worker made a path {len(fs.encode(path))} bytes long "
                f"('{fs.display(path)[:80]}...'), over the {MAX_PATH_BYTES}-byte bound; "
                "the change was not collected."
            )
        record = self.current.get(path)
        if record is None:
            if path in self.tracked and self.tracked[path].mode != "160000":
                self.deletes.append(path)
            return
        mode = record[2]
        if stat.S_ISREG(mode):
            self._want(path, "100755" if mode & stat.S_IXUSR else "100644", record[1])
        elif stat.S_ISLNK(mode):
            if is_git_file_name(parts[-1]):
                self.dropped.append(
                    Dropped(path, "a symlinked git metadata file is never collected")
                )
                return
            self._want(path, "120000", record[1])
        elif not stat.S_ISDIR(mode):
            self._special.append(path)

    def _want(self, path: str, mode: str, size: int) -> None:
        known = self.tracked.get(path)
        if (
            known is not None
            and known.mode == mode
            and known.size == size
            and self._same(path, known)
        ):
            return
        self.writes[path] = mode

    def _same(self, path: str, known: TreeEntry) -> bool:
        """Whether the file still holds the tracked blob (only asked when there is no stat
        baseline to tell; reads the file)."""
        try:
            data = (
                fs.read_link(self.dirs, path)
                if known.mode == "120000"
                else fs.read_regular(self.dirs, path, self.limits.file_bytes)
            )
        except OSError:
            return False
        if self._hasher is None:
            self._hasher = _blob_hasher(self.ws.repository)
        return self._hasher(data) == known.sha

    def drop_from_worktree(self) -> None:
        """Remove nested git metadata and special files: the host's git must never meet them."""
        for root in sorted(self._nested):
            fs.remove_tree(self.ws.worktree / root)
            self.dropped.append(Dropped(root, "nested git metadata (.git) is never collected"))
        for path in self._special:
            try:
                (self.ws.worktree / path).unlink()
            except OSError:
                pass
            self.dropped.append(
                Dropped(path, "not a regular file or symlink (FIFO, socket or device)")
            )
        if self._nested:
            inside = tuple(root + "/" for root in self._nested)
            self.writes = {p: m for p, m in self.writes.items() if not p.startswith(inside)}

    def leave_out_ignored(self) -> None:
        """New paths the repository's ignore rules exclude are left out, as `git add` would."""
        new = [p for p in self.writes if p not in self.tracked]
        if not new:
            return
        # "./" first: a name such as ":(glob)x" or ":!x" is then a path, never pathspec magic.
        proc = Git(self.ws.worktree).run(
            "check-ignore",
            "--no-index",
            "-z",
            "--stdin",
            input=nul_join(f"./{p}" for p in new),
            check=False,
            timeout=self.timeout,
        )
        if proc.returncode not in (0, 1):
            raise GitError(
                f"git check-ignore failed in {self.ws.worktree}", stderr=str(proc.stderr)
            )
        for raw in proc.stdout.split(b"\0"):
            if raw:
                self.writes.pop(fs.decode(raw).removeprefix("./"), None)

    def check_limits(self) -> None:
        total = 0
        for path, mode in self.writes.items():
            size = self.current[path][1]
            if mode != "120000" and size > self.limits.file_bytes:
                raise DiskFull(
                    f"The worker wrote '{fs.display(path)}' ({size / 2**20:.1f} MB), over the "
                    f"{self.limits.file_bytes / 2**20:.0f} MB limit for one file (limits.file_mb); "
                    "nothing was collected."
                )
            total += size
        if total > self.limits.change_bytes:
            raise DiskFull(
                f"The worker's change is {total / 2**20:.1f} MB, over the "
                f"{self.limits.change_bytes / 2**20:.0f} MB limit for a whole change "
                "(limits.change_mb); nothing was collected."
            )


_GIT_FILES = frozenset({".gitmodules", "gitmod~1", ".gitattributes", ".gitignore", ".mailmap"})


def _normal(name: str) -> str:
    """A name as Windows and git's NTFS protection see it: trailing dots and spaces dropped,
    case folded (so `.GIT`, `.git.` and `.git ` are all `.git`)."""
    return name.rstrip(" .").lower()


def is_git_file_name(part: str) -> bool:
    """Whether a name is one of the files git reads its own settings from (`.gitmodules`,
    `.gitattributes`, `.gitignore`, `.mailmap`, as git's NTFS protection spells them): never
    collected as a symlink, which git would follow out of the tree."""
    return _normal(part) in _GIT_FILES


def is_git_dir_name(part: str) -> bool:
    """Whether a path component names git metadata as git itself would refuse it in a tree:
    `.git` in any case, with trailing dots or spaces, the 8.3 name `git~1`, either before an
    NTFS stream's colon (`.git::$DATA`, `.git :x`, `git~1:x`), or any of those behind a
    backslash."""
    for piece in part.split("\\"):
        name = _normal(piece.partition(":")[0])
        if name in (".git", "git~1"):
            return True
    return False


def _blob_hasher(repo: Path):  # noqa: ANN202
    algorithm = object_format(repo)

    def blob_id(data: bytes) -> str:
        digest = hashlib.new(algorithm)
        digest.update(b"blob %d\0" % len(data))
        digest.update(data)
        return digest.hexdigest()

    return blob_id


def _quote(path: str) -> bytes:
    """A path in fast-import's C-style quoting (any byte is safe: quotes, newlines, non-UTF-8)."""
    out = bytearray(b'"')
    for byte in fs.encode(path):
        if byte in (0x22, 0x5C):
            out += b"\\" + bytes([byte])
        elif byte < 0x20 or byte >= 0x7F:
            out += b"\\%03o" % byte
        else:
            out.append(byte)
    return bytes(out + b'"')


def _commands(
    ws: TaskWorkspace, base: str, start: str, message: str, plan: _Plan, stop: Callable[[], None]
) -> Iterator[bytes]:
    text = message.encode()
    yield (
        b"commit refs/heads/%s\ncommitter worker-bridge <worker-bridge@localhost> %d +0000\n"
        b"data %d\n%s\nfrom %s\n"
        % (ws.branch.encode(), int(time.time()), len(text), text, base.encode())
    )
    if start != base:
        start_tree = Git(ws.repository).out("rev-parse", f"{start}^{{tree}}")
        yield b'M 040000 %s ""\n' % start_tree.encode()
    for path in plan.deletes:
        yield b"D %s\n" % _quote(path)
    with fs.OpenDirs(ws.worktree) as dirs:
        for n, (path, mode) in enumerate(sorted(plan.writes.items())):
            if n % STOP_EVERY == 0:
                stop()
            if mode == "120000":
                data = fs.read_link(dirs, path)
            else:
                data = fs.read_regular(dirs, path, plan.limits.file_bytes)
            yield b"M %s inline %s\ndata %d\n" % (mode.encode(), _quote(path), len(data))
            yield data
            yield b"\n"
    yield b"\ndone\n"


def _fast_malloc() -> dict[str, str]:
    """fast-import sets up a zlib stream per blob (about 256 KB), and glibc's malloc gives the
    memory back to the kernel after each one and faults it in again for the next: 100,000
    small blobs took 3.7 s, 2.7 s of it in the kernel. Keeping 64 MB of headroom at the top
    of the heap makes that 0.8 s. (Ignored by other C libraries.)"""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    ours = "glibc.malloc.top_pad=67108864"
    return {"GLIBC_TUNABLES": f"{tunables}:{ours}" if tunables else ours}


def _fast_import(
    ws: TaskWorkspace,
    base: str,
    start: str,
    message: str,
    plan: _Plan,
    stop: Callable[[], None],
) -> str:
    clear_stale_locks(ws)
    git = Git(ws.repository)
    with tempfile.TemporaryFile() as errors:
        proc = git.popen(
            "fast-import", "--quiet", "--done", "--force", stderr=errors, env=_fast_malloc()
        )
        try:
            assert proc.stdin is not None
            for chunk in _commands(ws, base, start, message, plan, stop):
                proc.stdin.write(chunk)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        code = proc.wait()
        if code != 0:
            errors.seek(0)
            detail = errors.read(4000).decode(errors="replace").strip().splitlines()
            raise GitError(
                f"git fast-import failed for task {ws.task_id}: {detail[-1] if detail else code}",
                stderr="\n".join(detail),
            )
    return git.out("rev-parse", "--verify", f"refs/heads/{ws.branch}")
