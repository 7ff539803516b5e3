"""Task worktrees: created on branch worker-bridge/<task_id> from the base commit with a byte-exact
checkout, given a private git dir for the container, and reclaimed (however deep or odd what the
worker left there is)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import BridgeError, ConfigError, InvalidSpec
from bridge.workspace import bases, fs, overlay, trash
from bridge.workspace.fs import chown_tree
from bridge.workspace.git import Git, common_git_dir, validate_branch_name
from bridge.workspace.locks import repository_lock
from bridge.workspace.objects import base_stores, container_alternates
from bridge.workspace.rawgit import object_format, raw_checkout

# Where the container sees its private git dir.
CONTAINER_GITDIR = "/var/lib/worker-bridge/git"


@dataclass(frozen=True)
class TaskWorkspace:
    """Host paths of one task's workspace."""

    task_id: str
    repository: Path
    worktree: Path
    branch: str
    private_gitdir: Path  # the container's git dir (its commits land here, never in the repo)
    gitfile: Path  # one line `gitdir: ...`, mounted read-only over the worktree's .git
    admin: Path  # the worktree's admin dir in the user's repository (.git/worktrees/<name>)
    layers: Path  # upper and work dirs when the worktree is an overlay mount (layered)

    @classmethod
    def plan(cls, home: Path, repository: Path, task_id: str) -> TaskWorkspace:
        branch = validate_branch_name(f"worker-bridge/{task_id}")
        gitroot = home / "gitdirs" / task_id
        return cls(
            task_id=task_id,
            repository=repository,
            worktree=home / "worktrees" / task_id,
            branch=branch,
            private_gitdir=gitroot / "git",
            gitfile=gitroot / "gitfile",
            admin=common_git_dir(repository) / "worktrees" / task_id,
            layers=home / "layers" / task_id,
        )

    @property
    def index(self) -> Path:
        """The worktree's own index: exactly the base checkout, with its stat information."""
        return self.admin / "index"

    @property
    def upper(self) -> Path | None:
        """The upper dir of a layered worktree (what the task wrote); None for a full one."""
        upper = self.layers / "upper"
        return upper if upper.is_dir() else None


@dataclass(frozen=True)
class Checkout:
    """How a worktree was made: ``layered`` (an overlay over the base's kept tree) or
    ``full``; ``fallback`` says why it is full where a layered one was asked for."""

    kind: str
    fallback: str | None = None


def check_allowed(roots: list[Path], repo: Path) -> None:
    """InvalidSpec unless ``repo`` (resolved) is inside one of ``roots`` (none: any)."""
    if not roots:
        return
    real = repo.resolve()
    for root in roots:
        if real == root.resolve() or root.resolve() in real.parents:
            return
    allowed = ", ".join(str(r) for r in roots)
    raise InvalidSpec(
        f"Repository {repo} is outside the folders tasks may work in ({allowed}); move it "
        "there or add its folder to `repositories` in config.yaml."
    )


def check_disjoint(home: Path, repository: Path) -> None:
    """The state root and the repository must not contain each other."""
    home, repository = home.resolve(), repository.resolve()
    if home == repository or home.is_relative_to(repository) or repository.is_relative_to(home):
        raise ConfigError(
            f"The state root {home} and the repository {repository} must not contain each other; "
            "set WORKER_BRIDGE_HOME elsewhere."
        )


def create_workspace(
    home: Path,
    ws: TaskWorkspace,
    base_commit: str,
    owner: tuple[int, int] | None,
    timeout: float = 300,
    *,
    layered: bool = False,
) -> Checkout:
    """Add the worktree (its files the base commit's blobs, byte for byte) and the container's
    private git dir. With ``layered``, the worktree is an overlay over the base commit's cached
    tree where the host can mount one (see `bridge.workspace.overlay`), else a full checkout
    (the reason in what is returned). On any failure, undo both."""
    check_disjoint(home, ws.repository)
    ws.worktree.parent.mkdir(parents=True, exist_ok=True)
    try:
        with repository_lock(home, ws.repository):
            Git(ws.repository).run(
                "worktree",
                "add",
                "--quiet",
                "--no-checkout",
                "-b",
                ws.branch,
                str(ws.worktree),
                base_commit,
                timeout=timeout,
            )
        if ws.admin.resolve() != _admin_of(ws.worktree):
            raise ConfigError(
                f"git registered the worktree of task {ws.task_id} under an unexpected name; "
                "run `git worktree prune` in the repository and try again."
            )
        made = _mount_layers(home, ws, base_commit, owner) if layered else Checkout("full")
        if made.kind == "full":
            raw_checkout(home, ws.repository, base_commit, ws.worktree, ws.index, keep_index=True)
            if owner is not None:
                chown_tree(ws.worktree, *owner)
        stores = base_stores(home, ws.repository, base_commit)
        _make_private_gitdir(ws, base_commit, len(stores))
        if owner is not None:
            chown_tree(ws.private_gitdir, *owner)
    except BaseException:
        remove_workspace(home, ws, delete_branch=True)
        raise
    return made


def _mount_layers(
    home: Path, ws: TaskWorkspace, base_commit: str, owner: tuple[int, int] | None
) -> Checkout:
    """The worktree as an overlay over the base commit's tree, its index the tree's; else
    (nothing left behind) a full one, and why: no overlay mounts here, the base tree could not
    be had (its lock, the disk), the kernel refused the mount."""
    if not overlay.overlay_usable(home):
        return Checkout("full", overlay.NO_OVERLAY)
    try:
        folder = bases.base_tree(home, ws.repository, base_commit, owner)
        # The worktree's own `.git` (the host's gitfile) stays visible in the merged view.
        bases.private_folder(ws.layers.parent)
        (ws.layers / "upper").mkdir(parents=True)
        shutil.copy2(ws.worktree / ".git", ws.layers / "upper" / ".git")
        _mount_over(ws, (folder / "tree",), owner)
        bases.copy_index(folder, ws.index)
    except (OSError, BridgeError, subprocess.SubprocessError) as exc:
        overlay.unmount(ws.worktree)
        fs.remove_tree(ws.layers)
        return Checkout("full", f"the layered checkout could not be made: {exc}")
    return Checkout("layered")


def _mount_over(ws: TaskWorkspace, lowers: tuple[Path, ...], owner: tuple[int, int] | None) -> None:
    """Mount the worktree over ``lowers`` (topmost first), recorded for mounting it again."""
    (ws.layers / bases.LOWERS_FILE).write_text("".join(f"{p}\n" for p in lowers))
    overlay.mount(overlay.Layers(lowers, ws.layers, ws.worktree), owner)


def _lowers(ws: TaskWorkspace) -> tuple[Path, ...]:
    try:
        return tuple(Path(p) for p in (ws.layers / bases.LOWERS_FILE).read_text().splitlines())
    except OSError:
        return ()


def layer_under(ws: TaskWorkspace, lower: Path, owner: tuple[int, int] | None) -> bool:
    """Put ``lower`` (a read-only tree: an environment's cached files) under a layered
    worktree that no container uses yet, in one step: what the worktree holds wins. False for
    a full worktree, and where the mount over ``lower`` fails (mounted again as it was)."""
    lowers = _lowers(ws)
    if ws.upper is None or not lowers:
        return False
    if lower in lowers:
        return True
    overlay.unmount(ws.worktree)
    try:
        _mount_over(ws, (*lowers, lower), owner)
    except OSError:
        _mount_over(ws, lowers, owner)
        return False
    return True


def ensure_mounted(
    home: Path, ws: TaskWorkspace, base_commit: str, owner: tuple[int, int] | None
) -> None:
    """A layered worktree mounted again where its mount is gone (a reboot, a reclaim); its
    upper dir holds what the task wrote so far."""
    if ws.upper is None or overlay.mounted(ws.worktree):
        return
    lowers = _lowers(ws) or (bases.base_tree(home, ws.repository, base_commit, owner) / "tree",)
    for lower in lowers[:1]:  # the base's tree, made again if it was pruned meanwhile
        if not lower.is_dir():
            bases.base_tree(home, ws.repository, base_commit, owner)
    overlay.mount(overlay.Layers(lowers, ws.layers, ws.worktree), owner)


def _admin_of(worktree: Path) -> Path:
    """The admin dir a fresh worktree's own `.git` file names (read once, before any container
    has run: afterwards the host never reads files of the worktree it did not write itself)."""
    text = fs.read_small(worktree / ".git").decode().removeprefix("gitdir:").strip()
    return Path(text).resolve()


def _make_private_gitdir(ws: TaskWorkspace, base_commit: str, stores: int) -> None:
    """A git dir whose objects come from the base commit's stores (read-only) and whose HEAD is
    the base commit, with the worktree's index, so `git status` in the container is clean."""
    gitdir = ws.private_gitdir
    for sub in ("objects/info", "objects/pack", "refs/heads", "refs/tags", "info"):
        (gitdir / sub).mkdir(parents=True, exist_ok=True)
    fmt = object_format(ws.repository)
    version, ext = (1, f"[extensions]\n\tobjectformat = {fmt}\n") if fmt != "sha1" else (0, "")
    # Not bare (the worktree is found through the gitfile); ctime not trusted (the run may
    # chown the files).
    (gitdir / "config").write_text(
        f"[core]\n\trepositoryformatversion = {version}\n\tfilemode = true\n\tbare = false\n"
        f"\tlogallrefupdates = true\n\ttrustctime = false\n{ext}"
    )
    alternates = "".join(f"{path}\n" for path in container_alternates(stores))
    (gitdir / "objects" / "info" / "alternates").write_text(alternates)
    (gitdir / "HEAD").write_text(base_commit + "\n")
    shutil.copyfile(ws.index, gitdir / "index")
    ws.gitfile.write_text(f"gitdir: {CONTAINER_GITDIR}\n")


def chown_paths(root: Path, paths: list[str], uid: int, gid: int) -> None:
    """Give ``paths`` under ``root``, and the folders leading to them, to uid:gid (through
    folder descriptors, never following a link; each folder once)."""
    folders: set[str] = set()
    with fs.OpenDirs(root) as dirs:
        for rel in paths:
            _lchown_at(dirs, rel, uid, gid)
            folder = rel.rpartition("/")[0]
            while folder and folder not in folders:
                folders.add(folder)
                _lchown_at(dirs, folder, uid, gid)
                folder = folder.rpartition("/")[0]


def _lchown_at(dirs: fs.OpenDirs, rel: str, uid: int, gid: int) -> None:
    try:
        parent, name = dirs.parent(rel)
        os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        pass


def clear_stale_locks(ws: TaskWorkspace) -> None:
    """Lock files git left for this task's own ref and worktree when a runner was killed in the
    middle of git's work. Only ever called by the task's one live runner, or by prune for a
    finished task, under the repository lock: no git of ours can be writing them."""
    common = common_git_dir(ws.repository)
    for lock in (
        common / "refs" / "heads" / f"{ws.branch}.lock",
        ws.admin / "index.lock",
        ws.admin / "HEAD.lock",
    ):
        lock.unlink(missing_ok=True)


def remove_workspace(
    home: Path, ws: TaskWorkspace, *, delete_branch: bool = False, defer: bool = False
) -> list[str]:
    """Remove the worktree and private git dir (and the branch when asked). Idempotent; returns
    what could not be removed, having removed the rest. With ``defer``, both are moved into
    the trash at once and removed there in the background (`workspace.trash`)."""
    failures: list[str] = []
    remove = (lambda path: trash.discard(home, path)) if defer else fs.remove_tree
    with repository_lock(home, ws.repository):
        clear_stale_locks(ws)
        repo = Git(ws.repository)
        overlay.unmount(ws.worktree)  # a layered worktree: its files are in ws.layers
        failures += remove(ws.worktree)
        # An admin dir left `locked` by a worktree add that was killed is not pruned by git.
        (ws.admin / "locked").unlink(missing_ok=True)
        repo.run("worktree", "prune", check=False)
        if ws.admin.exists() and not ws.worktree.exists():
            failures += fs.remove_tree(ws.admin)
        if delete_branch:
            repo.run("branch", "-D", "--quiet", ws.branch, check=False)
    failures += remove(ws.private_gitdir.parent)
    failures += remove(ws.layers)
    return failures
