"""Base trees: one byte-exact checkout of a base commit, kept under the state root
(`<home>/bases/<repo id>/<commit>-<uid>`) as the read-only lower dir of every layered worktree
and verification checkout made from that commit (see `bridge.workspace.overlay`).

A base tree is written once (under the repository's lock, into a temporary folder renamed into
place), with its index (stat information included, so the worker's `git status` starts clean),
and handed to the sandbox user, who must be able to copy its files up to change them. It is
never mounted into a container by itself and never written after it is ready; prune removes
those no mount uses. Picking or making one and marking it in use, and prune's last check that
one is unused before it renames it aside, hold one lock (`bases_lock`, across processes): a task
that starts on a base keeps it, and nobody is handed a half-removed one.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Set as AbstractSet
from pathlib import Path

from bridge.workspace import fs, overlay
from bridge.workspace.locks import bases_lock, repository_lock
from bridge.workspace.rawgit import raw_checkout, repo_id

_READY = "ready"
_REMOVING = ".removing-"  # a base folder renamed aside by prune, being deleted
LOWERS_FILE = "lowers"  # in a layered worktree's layers folder: its lower dirs, one a line
IDLE_S = 3600  # a base tree unused for this long may be pruned
LOCK_WAIT_S = 600.0  # how long base_tree() and prune wait for the bases lock (making holds it)


def bases_root(home: Path) -> Path:
    return home / "bases"


def private_folder(path: Path) -> Path:
    """``path`` (made when missing) as the bridge's own, mode 0700. What is under it (base trees
    and upper dirs, files of the sandbox uid) is reached by a sandbox only through an overlay
    mount (the kernel reads the layers with the mounter's rights), never by path: so no other
    host process, not one running as the sandbox uid either, can change a shared base."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.geteuid():  # made by something else before (an older bridge, by hand)
        os.chown(path, os.geteuid(), os.getegid())
    if st.st_mode & 0o7777 != 0o700:
        path.chmod(0o700)
    return path


def base_folder(home: Path, repo: Path, commit: str, owner: tuple[int, int] | None) -> Path:
    uid = owner[0] if owner is not None else os.geteuid()
    return bases_root(home) / repo_id(repo) / f"{commit}-{uid}"


def base_tree(home: Path, repo: Path, commit: str, owner: tuple[int, int] | None) -> Path:
    """The folder holding ``tree`` (the checkout of ``commit``) and ``index``; made once.
    BridgeError when the lock is not had in time; callers fall back to a full checkout."""
    folder = base_folder(home, repo, commit, owner)
    with bases_lock(home, LOCK_WAIT_S):
        private_folder(bases_root(home))
        if (folder / _READY).is_file():
            os.utime(folder / _READY)  # in use: prune leaves it for IDLE_S
            return folder
        with repository_lock(home, repo):
            _make(home, repo, commit, owner, folder)
    return folder


def _make(home: Path, repo: Path, commit: str, owner: tuple[int, int] | None, folder: Path) -> None:
    """Write the base folder into a temporary one renamed into place (its ready mark new)."""
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


def copy_index(folder: Path, dest: Path) -> None:
    """The base tree's index, as a worktree's own."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(folder / "index", dest)


def unused_bases(home: Path, leaving: AbstractSet[str] = frozenset()) -> list[Path]:
    """Base folders (and environment views, `bases/env/`) no layered worktree is over (its
    layers folder names it, mounted or not:
    a worktree unmounted by a reboot is mounted again over it), no mount uses, and nobody
    asked for within IDLE_S; ``leaving``: layers folders about to be removed. Only a plan:
    `remove_unused` checks again, under the lock, right before removing one."""
    root = bases_root(home)
    if not root.is_dir():
        return []
    used = _in_use(home, leaving)
    now = time.time()
    return [folder for folder in sorted(root.glob("*/*")) if _unused(folder, used, now)]


def remove_unused(home: Path, folder: Path, timeout: float | None = None) -> list[str]:
    """Remove the base folder ``folder`` if it is unused still: checked under the bases lock
    (no task can pick it meanwhile) and renamed aside there, then deleted outside the lock.
    Returns what could not be removed, or why it was kept."""
    with bases_lock(home, LOCK_WAIT_S if timeout is None else timeout):
        if not _unused(folder, _in_use(home, set()), time.time()):
            return (
                [f"{folder}: in use again (a task started on it), kept"] if folder.exists() else []
            )
        overlay.unmount_under(folder)  # an environment view's sealed image (never a task's)
        aside = folder.with_name(f"{_REMOVING}{folder.name}-{os.getpid()}-{os.urandom(3).hex()}")
        try:
            folder.rename(aside)
        except FileNotFoundError:
            return []
    return fs.remove_tree(aside)


def _in_use(home: Path, leaving: AbstractSet[str]) -> set[str]:
    """The trees layered worktrees are over (their lowers files) and mounts use (resolved:
    whichever way each process reached the state root, links and all)."""
    used = overlay.lower_dirs()
    for named in (home / "layers").glob(f"*/{LOWERS_FILE}"):
        if str(named.parent) not in leaving:
            try:
                used.update(overlay.real(Path(p)) for p in named.read_text().splitlines())
            except OSError:
                continue
    return used


def _unused(folder: Path, used: set[str], now: float) -> bool:
    if overlay.real(folder / "tree") in used:
        return False
    try:
        return now - (folder / _READY).stat().st_mtime >= IDLE_S
    except FileNotFoundError:  # half made by a dead process or half removed, else being made
        # (only ever under the lock, which `remove_unused` holds when it checks again)
        return folder.name.startswith((".tmp-", _REMOVING))
