"""Reclaim disk: worktrees and branches of finished tasks, orphan folders no task references,
orphan containers, and artifacts past the retention period. Dry run unless asked to apply.

Never touched: tasks that are not finished, and a succeeded task's work that was not accepted
yet (unless `include_unaccepted`). Accepted work already lives in the user's working tree.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bridge.errors import BridgeError
from bridge.models import Status
from bridge.pipeline.context import Context
from bridge.pipeline.recovery import orphan_containers
from bridge.store.db import now_iso
from bridge.workspace.git import Git
from bridge.workspace.locks import repository_lock
from bridge.workspace.worktree import TaskWorkspace, remove_workspace

RECLAIMABLE = {Status.FAILED, Status.CANCELLED, Status.TIMED_OUT, Status.REJECTED, Status.ACCEPTED}


@dataclass
class PruneAction:
    kind: str  # workspace | artifacts | orphan_dir | orphan_log | container
    target: str
    task_id: str | None
    reason: str


def _branch_exists(repo: Path, branch: str) -> bool:
    if not repo.is_dir():
        return False
    proc = Git(repo).run("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)
    return proc.returncode == 0


def plan_prune(ctx: Context, include_unaccepted: bool = False) -> list[PruneAction]:
    home = ctx.home
    actions: list[PruneAction] = []
    tasks = {t.task_id: t for t in ctx.store.list_tasks()}
    cutoff = datetime.now(UTC) - timedelta(days=ctx.config.retention_days)
    for task_id, task in tasks.items():
        status = task.status
        wanted = status in RECLAIMABLE or (include_unaccepted and status == Status.SUCCEEDED)
        if not wanted:
            continue
        repo = Path(task.repository)
        branch = f"worker-bridge/{task_id}"
        worktree = home / "worktrees" / task_id
        if (
            worktree.exists()
            or (home / "gitdirs" / task_id).exists()
            or _branch_exists(repo, branch)
        ):
            actions.append(
                PruneAction(
                    "workspace",
                    str(worktree),
                    task_id,
                    f"{status} task: worktree and branch {branch}",
                )
            )
        finished = task.finished_at
        task_dir = ctx.task_dir(task_id)
        if (
            task_dir.exists()
            and finished
            and datetime.fromisoformat(finished.replace("Z", "+00:00")) < cutoff
        ):
            actions.append(
                PruneAction(
                    "artifacts",
                    str(task_dir),
                    task_id,
                    f"{status} task finished over {ctx.config.retention_days} days ago",
                )
            )
    logs = home / "logs"
    if logs.is_dir():
        for entry in sorted(logs.glob("runner-*.log")):
            task_id = entry.name.removeprefix("runner-").removesuffix(".log")
            task = tasks.get(task_id)
            if task is None:
                actions.append(
                    PruneAction("orphan_log", str(entry), None, f"no task '{task_id}' in the store")
                )
    for folder in ("worktrees", "gitdirs", "tasks"):
        root = home / folder
        if not root.is_dir():
            continue
        for entry in sorted(root.iterdir()):
            if entry.name not in tasks:
                actions.append(
                    PruneAction(
                        "orphan_dir", str(entry), None, f"no task '{entry.name}' in the store"
                    )
                )
    try:
        for item in orphan_containers(ctx):
            task_id = item.labels.get("io.worker-bridge.task")
            actions.append(
                PruneAction(
                    "container", item.id[:12], task_id, "container of a finished or unknown task"
                )
            )
    except BridgeError:
        pass  # no engine reachable: no containers to reclaim from here
    return actions


def apply_prune(ctx: Context, actions: list[PruneAction]) -> list[PruneAction]:
    done = []
    for action in actions:
        if action.kind == "workspace" and action.task_id:
            repo = Path(ctx.store.load_task(action.task_id).repository)
            if repo.is_dir():
                ws = TaskWorkspace.plan(ctx.home, repo, action.task_id)
                remove_workspace(ctx.home, ws, delete_branch=True)
            else:  # the repository is gone: only our own folders are left to remove
                shutil.rmtree(action.target, ignore_errors=True)
                shutil.rmtree(ctx.home / "gitdirs" / action.task_id, ignore_errors=True)
            ctx.store.update_task(action.task_id, pruned_at=now_iso())
        elif action.kind == "artifacts" and action.task_id:
            shutil.rmtree(action.target, ignore_errors=True)
            (ctx.home / "logs" / f"runner-{action.task_id}.log").unlink(missing_ok=True)
            ctx.store.remove_artifacts(action.task_id)
        elif action.kind == "orphan_dir":
            _remove_orphan_dir(ctx, Path(action.target))
        elif action.kind == "orphan_log":
            Path(action.target).unlink(missing_ok=True)
        elif action.kind == "container":
            ctx.sandbox.remove(action.target)
        done.append(action)
    return done


def _remove_orphan_dir(ctx: Context, path: Path) -> None:
    """Remove a folder no task references; if it is a worktree git still knows, also drop the
    repository's record of it and its worker-bridge branch."""
    gitfile = path / ".git"
    repo = None
    if path.parent.name == "worktrees" and gitfile.is_file():
        text = gitfile.read_text(errors="replace").strip()
        if text.startswith("gitdir: "):
            admin = Path(text.removeprefix("gitdir: "))  # <repo>/.git/worktrees/<name>
            repo = admin.parent.parent.parent if admin.parent.name == "worktrees" else None
    shutil.rmtree(path, ignore_errors=True)
    if repo is not None and repo.is_dir():
        with repository_lock(ctx.home, repo.resolve()):
            git = Git(repo)
            git.run("worktree", "prune", check=False)
            branch = f"worker-bridge/{path.name}"
            if _branch_exists(repo, branch):
                git.run("branch", "-D", "--quiet", branch, check=False)


def prune(ctx: Context, apply: bool = False, include_unaccepted: bool = False) -> dict:
    actions = plan_prune(ctx, include_unaccepted)
    if apply:
        actions = apply_prune(ctx, actions)
    return {"applied": apply, "actions": [asdict(a) for a in actions]}
