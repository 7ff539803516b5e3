"""Accept's checks (the writing is `writer.py`, the orchestration `pipeline/accepting.py`): the
entries to write and what stands in their way in the user's tree (uncommitted changes, untracked
or ignored files, a symlink or file where a folder goes), the snapshot's symlinks (none that the
task adds or changes may point outside the repository, also through its other links), and the
written files read back against their blobs."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from bridge.workspace import fs
from bridge.workspace.diff import Change
from bridge.workspace.git import Git
from bridge.workspace.writer import Entry, Refused, blob_id, lstat_at, lstat_path


def _snapshot_symlinks(git: Git, snapshot: str) -> dict[str, str]:
    """Every symlink in the snapshot's tree: path -> target."""
    listing = git.run("ls-tree", "-r", "-z", "--full-tree", snapshot).stdout.split(b"\0")
    shas: dict[str, str] = {}
    for entry in listing:
        if entry.startswith(b"120000 "):
            meta, _, path = entry.partition(b"\t")
            shas[os.fsdecode(path)] = meta.split()[2].decode()
    if not shas:
        return {}
    # One `cat-file --batch` for all of them: "<sha> blob <size>\n<data>\n" each.
    out = git.run("cat-file", "--batch", input="".join(f"{s}\n" for s in shas.values()).encode())
    data, pos, blobs = out.stdout, 0, {}
    for sha in shas.values():
        header_end = data.index(b"\n", pos)
        size = int(data[pos:header_end].split()[2])
        blobs[sha] = data[header_end + 1 : header_end + 1 + size].decode(errors="replace")
        pos = header_end + 1 + size + 1
    return {path: blobs[sha] for path, sha in shas.items()}


def _resolve(
    base: list[str], target: str, links: dict[str, str], budget: list[int]
) -> list[str] | None:
    """Resolve ``target`` relative to the directory ``base`` inside the repository, following
    the snapshot's symlinks. None when it leaves the repository, enters .git, or loops."""
    if target.startswith("/"):
        return None
    stack = list(base)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return None
            stack.pop()
            continue
        stack.append(part)
        if stack[0].lower() == ".git":
            return None
        link = links.get("/".join(stack))
        if link is not None:
            budget[0] -= 1
            if budget[0] < 0:
                return None
            resolved = _resolve(stack[:-1], link, links, budget)
            if resolved is None:
                return None
            stack = resolved
    return stack


def escaping_symlink(
    git: Git, snapshot: str, changes: list[Change], repo: Path | None = None
) -> tuple[str, str] | None:
    """The first symlink the task adds or changes that points outside the repository, through
    the snapshot's own links, or (given ``repo``, the user's tree) through a symlink of the
    user's that the snapshot does not have (an untracked `venv -> /usr`)."""
    changed = [c.path for c in changes if c.mode == "120000"]
    if not changed:
        return None
    links = _snapshot_symlinks(git, snapshot)
    for path in changed:
        target = links.get(path, "")
        resolved = _resolve(path.split("/")[:-1], target, links, [40])
        if resolved is None or (repo is not None and _through_user_link(repo, resolved, links)):
            return path, target
    return None


def _through_user_link(repo: Path, parts: list[str], links: dict[str, str]) -> bool:
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if prefix not in links and os.path.islink(repo / prefix):
            return True
    return False


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


def entries_of_changes(changes: Iterable[Change]) -> list[Entry]:
    """The entries of a change's own target (the snapshot, when HEAD is still the base): each
    path with the mode and blob `git diff --raw` gave it, a rename's source deleted."""
    found: dict[str, Entry] = {}
    for change in changes:
        if change.old_path is not None:
            found.setdefault(change.old_path, Entry(change.old_path, None, None))
        found[change.path] = Entry(change.path, change.mode, change.sha)
    return [found[p] for p in sorted(found)]


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
    `.env`), one under a symlink or a file of the user's, or one outside the repository.
    Each folder on the way is looked at once, however many paths lie under it."""
    deleted = {e.path for e in entries if e.delete}
    folders: dict[str, os.stat_result | None] = {}
    absent_under: dict[str, bool] = {}  # a parent folder already checked: is it missing?
    root = str(repo)
    for entry in entries:
        path = entry.path
        parts = path.split("/")
        if (
            path.startswith("/")
            or ".." in parts
            or (".git" in path.lower() and any(p.lower() == ".git" for p in parts))
        ):
            where = fs.display(path)
            raise Refused(
                f"Refusing to accept: '{where}' is not a path inside the repository.",
                "symlink_escape",
            )
        if path in dirty:
            raise Refused(
                f"Refusing to accept: '{fs.display(path)}' has uncommitted changes in "
                f"{repo}; commit or stash them, then accept again."
            )
        parent = path.rpartition("/")[0]
        absent = absent_under.get(parent)
        if absent is None:
            absent_under[parent] = absent = _missing_folder(repo, parts, path, folders, deleted)
        st = None if absent else lstat_path(f"{root}/{path}")
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


def _missing_folder(
    repo: Path,
    parts: list[str],
    path: str,
    folders: dict[str, os.stat_result | None],
    deleted: set[str],
) -> bool:
    """Whether a folder on the way to ``path`` is missing (so the path is too); Refused when
    one is a symlink, or a file that the change does not delete. Each folder is looked at
    once, however many paths lie under it."""
    for i in range(1, len(parts)):
        folder = "/".join(parts[:i])
        if folder not in folders:
            folders[folder] = lstat_path(repo / folder)
        st = folders[folder]
        if st is None:
            return True
        if stat.S_ISLNK(st.st_mode):
            raise Refused(
                f"Refusing to accept: '{fs.display(folder)}' is a symlink in "
                f"{repo}, and writing '{fs.display(path)}' would go through it.",
                "symlink_escape",
            )
        if not stat.S_ISDIR(st.st_mode) and folder not in deleted:
            raise Refused(
                f"Refusing to accept: '{fs.display(folder)}' is a file in "
                f"{repo}, where the change needs a folder."
            )
    return False


def check_written(
    repo: Path,
    entries: list[Entry],
    written: Mapping[str, os.stat_result],
    algorithm: str,
    limit: int,
) -> str | None:
    """The first path that is not what the writer left there, or None. Each written path is
    reached without following a link. A file still the very one written, as its descriptor
    saw it once written (`Writer.written`: device, inode, mode, size, modification and change
    time; ctime cannot be set from user space), holds the blob's bytes: the writer hashed
    them before writing. Any other file there is read back against the blob (at most
    ``limit`` bytes), as every file once was: 0.1 s per 10,000 files, more than writing them.
    A regular file must be executable as its entry says, a link's target is read again, and
    a deleted path must be gone."""
    with fs.OpenDirs(repo) as dirs:
        for entry in entries:
            try:
                parent, name = dirs.parent(entry.path)
                st = lstat_at(parent, name)
            except FileNotFoundError:
                if entry.delete:
                    continue  # its folder went with it
                return entry.path
            except OSError:
                return entry.path
            if entry.delete:
                if st is not None and not stat.S_ISDIR(st.st_mode):
                    return entry.path
                continue
            if st is None or not _holds_blob(dirs, entry, st, written, algorithm, limit):
                return entry.path
    return None


def _holds_blob(
    dirs: fs.OpenDirs,
    entry: Entry,
    st: os.stat_result,
    written: Mapping[str, os.stat_result],
    algorithm: str,
    limit: int,
) -> bool:
    if entry.mode == "120000":
        if not stat.S_ISLNK(st.st_mode):
            return False
        try:
            return blob_id(algorithm, fs.read_link(dirs, entry.path)) == entry.sha
        except OSError:
            return False
    if not stat.S_ISREG(st.st_mode) or bool(st.st_mode & stat.S_IXUSR) != (entry.mode == "100755"):
        return False  # (a umask that takes the owner's bits, say)
    made = written.get(entry.path)
    if (
        made is not None
        and st.st_ino == made.st_ino
        and st.st_dev == made.st_dev
        and st.st_mode == made.st_mode
        and st.st_size == made.st_size
        and st.st_mtime_ns == made.st_mtime_ns
        and st.st_ctime_ns == made.st_ctime_ns
    ):
        return True
    try:  # not the file written (or a filesystem that moves its times): its bytes decide
        return blob_id(algorithm, fs.read_regular(dirs, entry.path, limit)) == entry.sha
    except OSError:
        return False
