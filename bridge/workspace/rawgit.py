"""Byte-exact checkouts: what the worker starts from, what verification checks and what accept
writes are the blobs themselves, with no attribute-driven conversion (`ident`, `filter`,
`eol`/`text`, `working-tree-encoding`, `export-subst`).

Git applies a repository's `.gitattributes` on every checkout, and the worker writes those files.
`$GIT_DIR/info/attributes` takes precedence over every `.gitattributes`, so checkouts here run
against a git dir of our own per repository (`<home>/rawgit/<id>`, never mounted into a
container): it borrows the repository's objects through `alternates` and unsets every converting
attribute for every path, with conversions off in its config too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from functools import lru_cache
from pathlib import Path

from bridge.errors import GitError
from bridge.workspace.git import Git, common_git_dir

NEUTRAL = "* -text -eol -crlf -ident -filter -working-tree-encoding -export-subst -export-ignore\n"
_CONFIG = (
    "[core]\n\trepositoryformatversion = {version}\n\tbare = true\n\tautocrlf = false\n"
    "\tsymlinks = true\n\tsafecrlf = false\n\tfilemode = true\n{extensions}"
)


def repo_id(repo: Path) -> str:
    return hashlib.sha256(str(repo).encode()).hexdigest()[:16]


@lru_cache(maxsize=64)
def object_format(repo: Path) -> str:
    """sha1 or sha256 (a repository's format does not change: asked once per process)."""
    return Git(repo).out("rev-parse", "--show-object-format")


def raw_gitdir(home: Path, repo: Path) -> Path:
    """The attribute-free git dir of ``repo`` (made on first use; safe to race)."""
    path = home / "rawgit" / repo_id(repo)
    objects = path / "objects" / "info" / "alternates"
    if objects.is_file():
        return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        (tmp / "objects" / "info").mkdir(parents=True)
        (tmp / "info").mkdir()
        (tmp / "refs").mkdir()
        (tmp / "HEAD").write_text("ref: refs/heads/none\n")
        fmt = object_format(repo)
        version, extensions = (
            (1, f"[extensions]\n\tobjectformat = {fmt}\n") if fmt != "sha1" else (0, "")
        )
        (tmp / "config").write_text(_CONFIG.format(version=version, extensions=extensions))
        (tmp / "info" / "attributes").write_text(NEUTRAL)
        (tmp / "objects" / "info" / "alternates").write_text(
            f"{common_git_dir(repo) / 'objects'}\n"
        )
        try:
            tmp.rename(path)
        except OSError:  # another process made it first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def raw_git(home: Path, repo: Path, work_tree: Path | None = None) -> Git:
    """Git on the raw git dir (objects: the repository's, plus whatever it writes itself)."""
    return Git(work_tree or repo, git_dir=raw_gitdir(home, repo), work_tree=work_tree)


def raw_checkout(
    home: Path, repo: Path, tree: str, dest: Path, index: Path, *, keep_index: bool = False
) -> None:
    """Write ``tree`` under ``dest`` byte for byte, through the index file ``index`` (kept, with
    stat information, when ``keep_index``: a worktree's own index; otherwise removed)."""
    git = raw_git(home, repo, work_tree=dest)
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        git.run("read-tree", tree, env=env)
        git.run("checkout-index", "--all", "--force", "--index", env=env)
    finally:
        if not keep_index:
            index.unlink(missing_ok=True)


def raw_write(
    home: Path, repo: Path, entries: list[tuple[str, str, str]], dest: Path, index: Path
) -> None:
    """Write only ``entries`` (mode, object id, path: as `git diff --raw` gives a tree's) under
    ``dest`` byte for byte, through a temporary index of just them: work in proportion to the
    entries, where reading the whole tree into an index costs in proportion to the tree."""
    if not entries:
        return
    git = raw_git(home, repo, work_tree=dest)
    env = {"GIT_INDEX_FILE": str(index)}
    listing = b"".join(
        f"{mode} {sha}\t".encode() + os.fsencode(path) + b"\0" for mode, sha, path in entries
    )
    index.unlink(missing_ok=True)
    try:
        made = git.run("update-index", "-z", "--index-info", env=env, input=listing)
        if made.stderr.strip():  # a path git refuses is left out with a warning, exit 0
            said = made.stderr.decode(errors="replace").strip().splitlines()[-1]
            raise GitError(f"git update-index left entries out in {dest}: {said}", stderr=said)
        git.run("checkout-index", "--all", "--force", env=env)
    finally:
        index.unlink(missing_ok=True)
