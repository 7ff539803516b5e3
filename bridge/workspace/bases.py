"""Base trees: one byte-exact checkout of a base commit, kept under the state root
(`<home>/bases/<repo id>/<commit>-<uid>`) as the read-only lower dir of every layered worktree
and verification checkout made from that commit (see `bridge.workspace.overlay`).

A base tree is written once (under the repository's lock, into a temporary folder renamed into
place), with its index (stat information included, so the worker's `git status` starts clean),
and handed to the sandbox user, who must be able to copy its files up to change them. It is
never mounted into a container by itself and never written after it is ready; prune removes
those no mount uses.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from bridge.workspace import fs
from bridge.workspace.locks import repository_lock
from bridge.workspace.rawgit import raw_checkout, repo_id

_READY = "ready"
LOWERS_FILE = "lowers"  # in a layered worktree's layers folder: its lower dirs, one a line
IDLE_S = 3600  # a base tree unused for this long may be pruned


def bases_root(home: Path) -> Path:
    return home / "bases"


def base_folder(home: Path, repo: Path, commit: str, owner: tuple[int, int] | None) -> Path:
    uid = owner[0] if owner is not None else os.geteuid()
    return bases_root(home) / repo_id(repo) / f"{commit}-{uid}"


def base_tree(home: Path, repo: Path, commit: str, owner: tuple[int, int] | None) -> Path:
    """The folder holding ``tree`` (the checkout of ``commit``) and ``index``; made once."""
    folder = base_folder(home, repo, commit, owner)
    if (folder / _READY).is_file():
        os.utime(folder / _READY)  # in use: prune leaves it for IDLE_S
        return folder
    with repository_lock(home, repo):
        if (folder / _READY).is_file():
            return folder
        tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}-{os.urandom(3).hex()}")
        try:
            (tmp / "tree").mkdir(parents=True)
            raw_checkout(home, repo, commit, tmp / "tree", tmp / "index", keep_index=True)
            if owner is not None:
                fs.chown_tree(tmp / "tree", *owner)
            (tmp / _READY).write_text(commit + "\n")
            if folder.exists():
                fs.remove_tree(folder)  # a half-made one (a crash)
            tmp.rename(folder)
        finally:
            if tmp.exists():
                fs.remove_tree(tmp)
    return folder


def copy_index(folder: Path, dest: Path) -> None:
    """The base tree's index, as a worktree's own."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(folder / "index", dest)


def unused_bases(home: Path, leaving: set[str] = frozenset()) -> list[Path]:
    """Base folders (and environment views, `bases/env/`) no layered worktree is over (its
    layers folder names it, mounted or not:
    a worktree unmounted by a reboot is mounted again over it), no mount uses, and nobody
    asked for within IDLE_S; ``leaving``: layers folders about to be removed."""
    root = bases_root(home)
    if not root.is_dir():
        return []
    used: set[str] = set()
    for named in (home / "layers").glob(f"*/{LOWERS_FILE}"):
        if str(named.parent) not in leaving:
            try:
                used.update(named.read_text().splitlines())
            except OSError:
                continue
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        mountinfo = ""
    now = time.time()
    found = []
    for folder in sorted(root.glob("*/*")):
        ready = folder / _READY
        if f"{folder}/tree" in used or f"{folder}/tree" in mountinfo:
            continue
        try:
            if now - ready.stat().st_mtime < IDLE_S:
                continue
        except FileNotFoundError:
            if not folder.name.startswith(".tmp-"):
                continue  # being made right now
        found.append(folder)
    return found
