"""Task worktrees: created on branch worker-bridge/<task_id> from the base commit, given a private
git dir for the container, snapshotted as a commit on the task branch, and reclaimed."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import ConfigError
from bridge.workspace.git import Git, common_git_dir, nul_join, validate_branch_name
from bridge.workspace.locks import repository_lock

# Where the container sees its private git dir and (read-only) the user's object store.
CONTAINER_GITDIR = "/var/lib/worker-bridge/git"
CONTAINER_OBJECTS = "/var/lib/worker-bridge/objects"


@dataclass(frozen=True)
class TaskWorkspace:
    """Host paths of one task's workspace."""

    task_id: str
    repository: Path
    worktree: Path
    branch: str
    private_gitdir: Path  # the container's git dir (its commits land here, never in the repo)
    gitfile: Path  # one line `gitdir: ...`, mounted read-only over the worktree's .git
    objects: Path  # the user's object store, mounted read-only

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
            objects=common_git_dir(repository) / "objects",
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
) -> None:
    """Add the worktree and the container's private git dir. On any failure, undo both."""
    check_disjoint(home, ws.repository)
    ws.worktree.parent.mkdir(parents=True, exist_ok=True)
    try:
        with repository_lock(home, ws.repository):
            Git(ws.repository).run(
                "worktree",
                "add",
                "--quiet",
                "-b",
                ws.branch,
                str(ws.worktree),
                base_commit,
                timeout=timeout,
            )
        _make_private_gitdir(ws, base_commit)
        if owner is not None:
            chown_tree(ws.worktree, *owner)
            chown_tree(ws.private_gitdir, *owner)
    except BaseException:
        remove_workspace(home, ws, delete_branch=True)
        raise


def _make_private_gitdir(ws: TaskWorkspace, base_commit: str) -> None:
    """A git dir whose objects borrow the user's (read-only) and whose HEAD is the base commit,
    with the worktree's index, so `git status` in the container is clean at start."""
    gitdir = ws.private_gitdir
    Git(ws.worktree).run("init", "--quiet", "--bare", str(gitdir))
    # Our own git dir, so its config is written whole rather than by one `git config` each:
    # not bare (the worktree is found through the gitfile), and ctime not trusted because the
    # run may chown the files.
    (gitdir / "config").write_text(
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
        "\tlogallrefupdates = true\n\ttrustctime = false\n"
    )
    (gitdir / "objects" / "info" / "alternates").write_text(CONTAINER_OBJECTS + "\n")
    (gitdir / "HEAD").write_text(base_commit + "\n")
    shutil.copyfile(_worktree_gitdir(ws) / "index", gitdir / "index")
    ws.gitfile.write_text(f"gitdir: {CONTAINER_GITDIR}\n")


def _worktree_gitdir(ws: TaskWorkspace) -> Path:
    """The worktree's admin dir in the user's repository (.git/worktrees/<name>), as named by
    the worktree's own `.git` file."""
    path = Path((ws.worktree / ".git").read_text().removeprefix("gitdir:").strip())
    return path if path.is_absolute() else (ws.worktree / path).resolve()


def chown_tree(root: Path, uid: int, gid: int) -> None:
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


def chown_paths(root: Path, paths: list[str], uid: int, gid: int) -> None:
    """Give ``paths`` under ``root``, and the folders leading to them, to uid:gid."""
    done: set[Path] = set()
    for rel in paths:
        target = root / rel
        while target != root and target not in done:
            if os.path.lexists(target):
                os.lchown(target, uid, gid)
            done.add(target)
            target = target.parent


def snapshot_worktree(
    ws: TaskWorkspace, base_commit: str, message: str, touched: list[str] | None = None
) -> str:
    """Commit the worktree's files (as they are, against the base commit) to the task branch.

    Whatever the worker did with git inside the container is ignored: the snapshot's parent is
    always the base commit and its tree is built from the files, with the repository's ignores.
    ``touched`` (from `baseline.touched_paths`) limits the work to those paths; without it,
    every file is examined.
    """
    git = Git(ws.worktree)
    index = ws.private_gitdir.parent / "snapshot.index"
    env = {"GIT_INDEX_FILE": str(index)}
    # Start from the worktree's own index, as checked out from the base commit; ctime is not
    # trusted because the run may have chowned the files.
    shutil.copyfile(_worktree_gitdir(ws) / "index", index)
    if touched is None or any(".git" in path.split("/") for path in touched):
        git.run("-c", "core.trustctime=false", "add", "--all", "--", ".", env=env)
    elif touched:
        ignored = git.run(
            "check-ignore", "-z", "--stdin", input=nul_join(touched), env=env, check=False
        ).stdout.split(b"\0")
        wanted = sorted(set(touched) - {p.decode() for p in ignored if p})
        if wanted:
            git.run(
                "-c",
                "core.trustctime=false",
                "add",
                "--all",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                input=nul_join(f":(literal){p}" for p in wanted),
                env=env,
            )
    tree = git.out("write-tree", env=env)
    commit = git.out("commit-tree", tree, "-p", base_commit, "-m", message)
    Git(ws.repository).run("update-ref", f"refs/heads/{ws.branch}", commit)
    index.unlink(missing_ok=True)
    return commit


def remove_workspace(home: Path, ws: TaskWorkspace, *, delete_branch: bool = False) -> None:
    """Remove the worktree and private git dir (and the branch when asked). Idempotent."""
    with repository_lock(home, ws.repository):
        repo = Git(ws.repository)
        repo.run("worktree", "remove", "--force", str(ws.worktree), check=False)
        if ws.worktree.exists():
            shutil.rmtree(ws.worktree, ignore_errors=True)
        repo.run("worktree", "prune", check=False)
        if delete_branch:
            repo.run("branch", "-D", "--quiet", ws.branch, check=False)
    shutil.rmtree(ws.private_gitdir.parent, ignore_errors=True)
