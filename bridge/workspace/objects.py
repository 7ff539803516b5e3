"""What the sandbox's git may read: exactly the objects reachable from the task's base commit, not
the user's other branches, stashes or other tasks' snapshots.

The container's private git dir borrows objects (read-only `alternates`) from stores made here
and cached per base commit under `<home>/objects/<repo id>/<base>/`. A store holds one pack of
`git rev-list --objects <base> ^<parent>`, where the parent is an earlier cached base that is an
ancestor of this one (so a new commit on a branch costs a pack of what it added, not of the
whole history); a chain is at most MAX_CHAIN stores long, then a full pack starts a new one.
The stores of a chain are mounted one by one, each at `<CONTAINER_OBJECTS>/<n>`.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from bridge.workspace.git import Git, common_git_dir
from bridge.workspace.locks import repository_lock
from bridge.workspace.rawgit import repo_id

CONTAINER_OBJECTS = "/var/lib/worker-bridge/objects"
MAX_CHAIN = 8
_READY = "ready"


def cache_root(home: Path, repo: Path) -> Path:
    return home / "objects" / repo_id(repo)


def base_stores(home: Path, repo: Path, base: str) -> list[Path]:
    """The object stores (host paths, nearest first) that together hold exactly the objects
    reachable from ``base``; made (once, under the repository's lock) when missing."""
    root = cache_root(home, repo)
    store = root / base
    if not (store / _READY).is_file():
        with repository_lock(home, repo):
            if not (store / _READY).is_file():
                _make_store(repo, root, base)
    return _chain(root, base)


def _chain(root: Path, base: str) -> list[Path]:
    chain, sha = [], base
    while sha:
        chain.append(root / sha)
        parent = root / sha / "parent"
        sha = parent.read_text().strip() if parent.is_file() else ""
    return chain


def _make_store(repo: Path, root: Path, base: str) -> None:
    git = Git(repo)
    parent = _nearest_ancestor(git, root, base)
    tmp = root / f".tmp-{base}-{os.getpid()}-{os.urandom(3).hex()}"
    try:
        (tmp / "pack").mkdir(parents=True)
        (tmp / "objects").mkdir()
        revs = f"{base}\n" + (f"^{parent}\n" if parent else "")
        git.run(
            "pack-objects",
            "--revs",
            "--delta-base-offset",
            "-q",
            str(tmp / "pack" / "pack"),
            input=revs.encode(),
            # git writes the pack in its object directory, then renames it into place, which
            # fails across filesystems (the repository on another disk, or another bind mount
            # of the bridge's container): an empty one under the state root, with the
            # repository's objects as its alternate, keeps the rename on one filesystem.
            env={
                "GIT_OBJECT_DIRECTORY": str(tmp / "objects"),
                "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(common_git_dir(repo) / "objects"),
            },
        )
        shutil.rmtree(tmp / "objects")
        if parent:
            (tmp / "parent").write_text(parent + "\n")
        for entry in (tmp, tmp / "pack", *(tmp / "pack").iterdir()):
            entry.chmod(0o755 if entry.is_dir() else 0o444)
        (tmp / _READY).write_text(f"{time.time()}\n")
        shutil.rmtree(root / base, ignore_errors=True)  # a half-made one (a crash)
        tmp.rename(root / base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _nearest_ancestor(git: Git, root: Path, base: str) -> str | None:
    """The most recently made cached base that is an ancestor of ``base`` and whose chain has
    room for one more store; None for a full pack."""
    if not root.is_dir():
        return None
    ready = sorted(
        (p for p in root.iterdir() if (p / _READY).is_file()),
        key=lambda p: (p / _READY).stat().st_mtime,
        reverse=True,
    )
    for store in ready[:16]:
        if len(_chain(root, store.name)) >= MAX_CHAIN:
            continue
        proc = git.run("merge-base", "--is-ancestor", store.name, base, check=False)
        if proc.returncode == 0:
            return store.name
    return None


def container_alternates(count: int) -> list[str]:
    """Where the stores of a chain are mounted in the container, nearest first."""
    return [f"{CONTAINER_OBJECTS}/{n}" for n in range(count)]


def stores_in_use(home: Path, repo: Path, bases: set[str]) -> set[Path]:
    """Every store the chains of ``bases`` need (what prune must keep)."""
    root = cache_root(home, repo)
    return {store for base in bases if (root / base).is_dir() for store in _chain(root, base)}
