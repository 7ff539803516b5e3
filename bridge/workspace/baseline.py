"""Which files a worker run touched: from a stat record taken just before it started, or, in a
layered worktree, from its upper dir alone (see `bridge.workspace.overlay`).

`git add --all` on a fresh checkout re-hashes every file: git's racy-clean rule (second
granularity) makes every entry written in the same second as the index suspect. We know more
than git here: we record each file's inode, size, mode and nanosecond mtime and ctime right
before the container starts. ctime cannot be set from user space, so a file whose record is
unchanged was not written, and only the touched paths need to go through git.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import DiskFull
from bridge.workspace import fs
from bridge.workspace.git import Git
from bridge.workspace.overlay import changed_candidates, upper_entries
from bridge.workspace.worktree import TaskWorkspace

Stat = tuple[int, int, int, int, int]  # inode, size, mode, mtime_ns, ctime_ns


def record_files(root: Path, limit: int | None = None) -> dict[str, Stat]:
    """Every entry under ``root`` but directories (files, symlinks, special files), as
    relative path -> stat, except the top-level `.git`. Never follows a link; any depth up to
    `fs.MAX_DEPTH`, any name (see `bridge.workspace.fs`). More than ``limit`` entries raise
    DiskFull (limits.files)."""
    found: dict[str, Stat] = {}
    for path, st in fs.walk(root, skip=frozenset({".git"})):
        if limit is not None and len(found) >= limit:
            raise DiskFull(
                f"{root} holds more than {limit} files (limits.files); raise the limit or "
                "narrow the task."
            )
        found[path] = (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
    return found


def touched_paths(before: dict[str, Stat], after: dict[str, Stat]) -> list[str]:
    """Paths added, removed or changed in any way between two records."""
    changed = {path for path, stat in after.items() if before.get(path) != stat}
    changed |= before.keys() - after.keys()
    return sorted(changed)


@dataclass(frozen=True)
class TreeEntry:
    mode: str  # 100644 | 100755 | 120000 | 160000 | 040000
    sha: str
    size: int


def tree_entries(
    repo: Path, commit: str, sizes: bool, paths: list[str] | None = None, recursive: bool = True
) -> dict[str, TreeEntry]:
    """Every entry of ``commit``'s tree (only those at or under ``paths`` when given, taken
    literally; without ``recursive``, a folder's own entry); blob sizes (which cost a lookup
    each) only when asked, for comparing files without a stat baseline."""
    if paths is not None and not paths:
        return {}
    args = ["ls-tree", *(["-r"] if recursive else []), "-z", "--full-tree"]
    args += [*(["-l"] if sizes else []), commit]
    if paths is not None:
        args += ["--", *paths]
    out = Git(repo).run(*args, env={"GIT_LITERAL_PATHSPECS": "1"}).stdout
    entries = {}
    for item in out.split(b"\0"):
        if not item:
            continue
        meta, _, path = item.partition(b"\t")
        mode, _kind, sha, *size = meta.split()
        length = int(size[0]) if size and size[0].isdigit() else -1
        entries[fs.decode(path)] = TreeEntry(mode.decode(), sha.decode(), length)
    return entries


def walked_candidates(
    ws: TaskWorkspace, start: str, entries: int, baseline: dict[str, Stat] | None
) -> tuple[set[str], dict[str, Stat], dict[str, TreeEntry]]:
    """A full worktree: every file's stat, and the paths touched since ``baseline`` (all of
    them without one)."""
    try:
        current = record_files(ws.worktree, limit=entries)
    except fs.TreeTooDeep as exc:
        raise DiskFull(f"The worker made a folder tree too deep to collect: {exc}.") from exc
    tracked = tree_entries(ws.repository, start, sizes=baseline is None)
    if baseline is not None:
        candidates = set(touched_paths(baseline, current))
        if any(p.rsplit("/", 1)[-1] == ".gitignore" for p in candidates):
            candidates |= current.keys() - tracked.keys()  # what is ignored may have changed
    else:
        candidates = current.keys() | {p for p, e in tracked.items() if e.mode != "160000"}
    return candidates, current, tracked


PATHSPEC_MAX = 2000  # more changed paths than this: the start's whole tree is listed instead
ARGV_BYTES = 100 * 1024  # ... and so it is when their names would make a long command line


def layered_candidates(
    ws: TaskWorkspace, upper: Path, base: str, start: str, entries: int
) -> tuple[set[str], dict[str, Stat], dict[str, TreeEntry]]:
    """A layered worktree (its lower dir the base's tree): the candidates are what the upper
    dir holds or hides, and, on a later turn, what the start differs from the base in (a file
    an earlier turn added and this one removed leaves nothing in the upper dir). Each is then
    looked at in the merged view, never through a link; only those are stat'ed, and only the
    start's entries at those paths are listed (for a small change)."""
    try:
        upper_found = upper_entries(upper)
        # A folder renamed in place holds lower files the upper dir does not: all it holds, read
        # in the merged view (the folder and those above it are folders of the upper dir there,
        # so no link is on the way).
        moved = {f"{m}/{rel}" for m in upper_found.moved for rel, _ in fs.walk_all(ws.worktree / m)}
    except fs.TreeTooDeep as exc:
        raise DiskFull(f"The worker made a folder tree too deep to collect: {exc}.") from exc
    folders, others = upper_found.folders, upper_found.others
    if start != base:
        out = Git(ws.repository).run("diff", "--name-only", "--no-renames", "-z", base, start)
        others += [fs.decode(p) for p in out.stdout.split(b"\0") if p]
    candidates = set(folders) | set(others) | moved
    if len(candidates) > entries:
        raise DiskFull(
            f"{ws.worktree} holds more than {entries} changed files (limits.files); "
            "raise the limit or narrow the task."
        )
    if (
        len(candidates) <= PATHSPEC_MAX
        and sum(len(fs.encode(p)) + 1 for p in candidates) < ARGV_BYTES
    ):
        # What is at or under a file, link, whiteout or opaque folder of the upper dir (or a
        # path the start changed), and a plain folder's own entry (a file it replaced, or the
        # submodule it is).
        tracked = tree_entries(ws.repository, start, sizes=False, paths=sorted(set(others)))
        own = tree_entries(ws.repository, start, False, sorted(folders), recursive=False)
        # A folder that is a folder in the start too is no entry of its own (a listing without
        # -r shows it as a tree, which the plan would take for a deleted file).
        tracked |= {p: e for p, e in own.items() if e.mode != "040000"}
        candidates |= tracked.keys()
    else:
        tracked = tree_entries(ws.repository, start, sizes=False)
        lower: AbstractSet[str] = tracked.keys()
        if start != base:
            lower = lower | tree_entries(ws.repository, base, sizes=False).keys()
        candidates |= changed_candidates(upper, lower)
    current: dict[str, Stat] = {}
    with fs.OpenDirs(ws.worktree) as dirs:
        for path in candidates:
            try:
                parent, name = dirs.parent(path)
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except OSError:
                continue  # gone, or under a link or a file: absent, as a walk would find it
            if not stat.S_ISDIR(st.st_mode):
                current[path] = (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
    return candidates, current, tracked
