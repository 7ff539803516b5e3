"""What a task changed, always computed on the host from base commit to snapshot commit:
the binary diff, the manifest (path, change kind, size, mode) and the protected-path check."""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple, NotRequired, TypedDict

from bridge.documents import BinaryNote
from bridge.workspace import fs
from bridge.workspace.fs import display
from bridge.workspace.git import Git
from bridge.workspace.rawgit import raw_checkout, raw_write

_KINDS = {
    "A": "added",
    "M": "modified",
    "D": "deleted",
    "R": "renamed",
    "T": "type_changed",
    "C": "added",
}


# A changed path as the task result lists it (`from`: a rename's source) and as the manifest
# does, with the modes, size and blob. (`from` is a keyword, hence the functional form.)
# A file git shows as binary carries what the readable diff found of it (`binary`).
ChangedEntry = TypedDict(
    "ChangedEntry",
    {"path": str, "change": str, "from": NotRequired[str], "binary": NotRequired[BinaryNote]},
)
ManifestEntry = TypedDict(
    "ManifestEntry",
    {
        "path": str,
        "change": str,
        "from": NotRequired[str],
        "binary": NotRequired[BinaryNote],
        "mode": str | None,
        "old_mode": str | None,
        "size": int | None,
        "sha": str | None,
        "symlink": bool,
    },
)


class Change(NamedTuple):
    """One changed path, from `git diff --raw` (a tuple: a large change makes 100,000 of
    them, and a frozen dataclass takes twice as long to make)."""

    path: str
    change: str
    old_path: str | None = None
    old_mode: str | None = None
    mode: str | None = None
    sha: str | None = None
    size: int | None = None
    old_sha: str | None = None  # the base's blob at the path (or a rename's source)

    def result_entry(self) -> ChangedEntry:
        """For the result and the manifest: names that are not UTF-8 shown with \\x escapes."""
        entry: ChangedEntry = {"path": display(self.path), "change": self.change}
        if self.change == "renamed" and self.old_path is not None:
            entry["from"] = display(self.old_path)
        return entry

    def manifest_entry(self) -> ManifestEntry:
        return {
            **self.result_entry(),
            "mode": self.mode,
            "old_mode": self.old_mode,
            "size": self.size,
            "sha": self.sha,
            "symlink": self.mode == "120000",
        }

    @property
    def written(self) -> tuple[str, str, str] | None:
        """(mode, blob, path) of what the snapshot holds at the path; None for a deletion."""
        if self.mode is None or self.sha is None:
            return None
        return self.mode, self.sha, self.path

    @property
    def paths(self) -> list[str]:
        return [self.path] + ([self.old_path] if self.old_path else [])


# One line of `git diff --raw`: status letter, source path of a rename, path, old mode, new
# mode, old blob, new blob.
_Raw = tuple[str, str | None, str, str, str, str, str]


def list_changes(repo: Path, base: str, snapshot: str, *, sizes: bool = True) -> list[Change]:
    """Parse `git diff --raw -z -M` (safe for any file name: spaces, unicode, newlines); blob
    sizes (one `cat-file --batch-check` for all) unless ``sizes`` is off."""
    git = Git(repo)
    raw = git.run(
        "diff", "--raw", "-z", "-M", "--no-abbrev", "--no-ext-diff", base, snapshot
    ).stdout
    lines = _parse_raw(fs.decode_fields(raw))
    wanted = [sha for letter, _, _, _, mode, _, sha in lines if letter != "D" and mode != "160000"]
    known = _sizes(git, wanted) if sizes else {}
    changes = []
    for letter, old_path, path, old_mode, new_mode, old_sha, new_sha in lines:
        kept = letter != "D"
        changes.append(
            Change(
                path,
                _KINDS.get(letter, "modified"),
                old_path,
                None if old_mode == "000000" else old_mode,
                new_mode if kept else None,
                new_sha if kept else None,
                known.get(new_sha) if kept else None,
                None if old_mode == "000000" else old_sha,
            )
        )
    return changes


def _parse_raw(fields: list[str]) -> list[_Raw]:
    lines: list[_Raw] = []
    i, end = 0, len(fields)
    while i < end and fields[i]:
        old_mode, new_mode, old_sha, new_sha, status = fields[i].lstrip(":").split()
        letter = status[0]
        if letter in "RC":
            old_path, path = fields[i + 1], fields[i + 2]
            i += 3
        else:
            old_path, path = None, fields[i + 1]
            i += 2
        source = old_path if letter == "R" else None
        lines.append((letter, source, path, old_mode, new_mode, old_sha, new_sha))
    return lines


def _sizes(git: Git, shas: list[str]) -> dict[str, int]:
    if not shas:
        return {}
    out = git.run(
        "cat-file",
        "--batch-check=%(objectname) %(objectsize)",
        input="\n".join(shas).encode() + b"\n",
    ).stdout.decode()
    sizes = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            sizes[parts[0]] = int(parts[1])
    return sizes


# `git diff`'s options for what a task changed, whatever the user's configuration says.
_DIFF_OPTIONS = (
    "--full-index",
    "-M",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--src-prefix=a/",  # whatever diff.noprefix or diff.mnemonicPrefix the user set
    "--dst-prefix=b/",
    "--no-relative",
)


def git_diff(repo: Path, base: str, snapshot: str, form: str = "--binary") -> bytes:
    """`git diff` base -> snapshot: ``--binary`` (the patch accept applies) or ``--text``
    (every file as text, a binary one's bytes as they are)."""
    return Git(repo).run("diff", form, *_DIFF_OPTIONS, base, snapshot).stdout


def write_diff(repo: Path, base: str, snapshot: str, dest: Path) -> tuple[int, str]:
    """Write `git diff --binary` base -> snapshot to ``dest``; return (size, sha256)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    data = git_diff(repo, base, snapshot)
    dest.write_bytes(data)
    return len(data), hashlib.sha256(data).hexdigest()


def write_manifest(changes: list[Change], base: str, snapshot: str, dest: Path) -> tuple[int, str]:
    """The manifest as JSON with one file per line, each line from json's C encoder (an
    indented document is the pure-Python encoder's: 1.2 s for 100,000 files)."""
    commits = f'"base_commit": {json.dumps(base)}, "snapshot_commit": {json.dumps(snapshot)}'
    files = "".join(
        f"{',' if i else ''}\n  {json.dumps(c.manifest_entry(), ensure_ascii=False)}"
        for i, c in enumerate(changes)
    )
    data = f'{{{commits},\n "files": [{files}\n]}}\n'.encode()
    dest.write_bytes(data)
    return len(data), hashlib.sha256(data).hexdigest()


def _glob_body(pattern: str) -> str:
    """`**` spans directories, `*` and `?` stay within one; a bare directory covers its files."""
    pattern = pattern.strip().lstrip("/")
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out).rstrip("/")


@lru_cache(maxsize=256)
def _globs_regex(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex matching what any of ``patterns`` matches (None for no pattern): one match
    per path, however many patterns."""
    bodies = [_glob_body(p) for p in patterns if p.strip()]
    if not bodies:
        return None
    return re.compile(f"^(?:{'|'.join(bodies)})(?:/.*)?$", re.DOTALL)


def protected_violations(
    changes: list[Change], patterns: list[str], allowed: list[str] | None = None
) -> list[str]:
    """Paths the task changed that match a protected pattern, except those matching one of
    ``allowed`` (the protected paths the task's approved path requests named)."""
    protected = _globs_regex(tuple(patterns))
    if protected is None:
        return []
    exempt = _globs_regex(tuple(allowed or ()))
    return [
        path
        for change in changes
        for path in change.paths
        if protected.match(path) and not (exempt and exempt.match(path))
    ]


def path_matches(path: str, patterns: list[str]) -> bool:
    regex = _globs_regex(tuple(patterns))
    return regex is not None and regex.match(path) is not None


def export_snapshot(home: Path, repo: Path, tree: str, dest: Path, scratch: Path) -> None:
    """A clean, byte-exact checkout of exactly ``tree`` in ``dest`` (no .git, no ignored files;
    never `git archive`, whose export-ignore and export-subst the worker controls)."""
    dest.mkdir(parents=True, exist_ok=False)
    raw_checkout(home, repo, tree, dest, scratch / f"checkout-{dest.name}.index")


def update_checkout(
    home: Path, repo: Path, dest: Path, changes: list[Change], scratch: Path
) -> list[str]:
    """Bring a clean checkout of the base commit to the snapshot ``changes`` lead to (their
    modes and blobs, from `git diff --raw`) by touching only the changed paths: deletions (and
    rename sources) first, the folders they emptied after them (each looked at once), then the
    rest. Returns the paths written."""
    emptied: set[str] = set()
    for change in changes:
        for path in ([change.old_path] if change.old_path else []) + (
            [change.path] if change.change in ("deleted", "type_changed") else []
        ):
            fs.remove_tree(dest / path)
            emptied.add(path.rpartition("/")[0])
    fs.remove_empty_folders(dest, emptied)
    kept = [entry for c in changes if (entry := c.written) is not None]
    raw_write(home, repo, kept, dest, scratch / f"checkout-{dest.name}.index")
    return [path for _, _, path in kept]
