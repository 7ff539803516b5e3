"""Reclaim disk: worktrees and branches of finished tasks, orphan folders no task references,
orphan containers, object caches no task needs, and artifacts past the retention period. Dry run
unless asked to apply; what could not be removed is reported and the rest goes on.

Never touched: tasks that are not finished, a succeeded task's work that was not accepted
yet (unless `include_unaccepted`), and anything of a repository outside the bridge's scope
(config `repositories`): its tasks, the worktree records in it, its object caches. Accepted work
already lives in the user's working tree.
A snapshot's objects stay in the repository's object store after its branch is deleted (they
may be shared with the user's own objects, so only git may delete them): prune says how many
bytes, and `git gc` reclaims them once they are unreachable and past `gc.pruneExpire`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bridge.documents import PruneReport, Removal
from bridge.errors import BridgeError
from bridge.models import JOB_TERMINAL, Status
from bridge.phase.context import Context
from bridge.pipeline.recovery import orphan_containers
from bridge.records import TaskRecord
from bridge.scope import RepositoryScope
from bridge.store.db import now_iso
from bridge.workspace import fs, overlay, trash
from bridge.workspace.bases import bases_root, remove_unused, unused_bases
from bridge.workspace.git import Git
from bridge.workspace.locks import repository_lock
from bridge.workspace.objects import stores_in_use
from bridge.workspace.rawgit import repo_id
from bridge.workspace.worktree import TaskWorkspace, remove_workspace

RECLAIMABLE = {Status.FAILED, Status.CANCELLED, Status.TIMED_OUT, Status.REJECTED, Status.ACCEPTED}


@dataclass
class PruneAction:
    kind: str  # workspace | artifacts | orphan_dir | orphan_log | container | object_cache | trash
    # | pool
    target: str
    task_id: str | None
    reason: str
    failed: list[str] | None = None  # what could not be removed, when applied

    def document(self) -> Removal:
        return Removal(
            kind=self.kind,
            target=self.target,
            task_id=self.task_id,
            reason=self.reason,
            failed=self.failed,
        )


def _branch_exists(repo: Path, branch: str) -> bool:
    if not repo.is_dir():
        return False
    proc = Git(repo).run("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)
    return proc.returncode == 0


def _kept_objects(repo: Path, branch: str, base: str | None) -> str:
    """What the branch's snapshot added to the repository's store, as a clause (or '')."""
    if not base or not _branch_exists(repo, branch):
        return ""
    proc = Git(repo).run(
        "rev-list", "--objects", "--disk-usage", f"refs/heads/{branch}", f"^{base}", check=False
    )
    size = proc.stdout.decode().strip()
    if proc.returncode != 0 or not size.isdigit():
        return ""
    return (
        f"; its snapshot's objects ({int(size) / 1024:.0f} KiB) stay in the object store for git gc"
    )


def _wanted(task: TaskRecord, include_unaccepted: bool) -> bool:
    return task.status in RECLAIMABLE or (include_unaccepted and task.status == Status.SUCCEEDED)


def plan_prune(
    ctx: Context, include_unaccepted: bool = False, scope: RepositoryScope | None = None
) -> list[PruneAction]:
    home = ctx.home
    scope = scope or RepositoryScope()
    # Every task counts for what is an orphan; only those in scope are pruned.
    tasks = {t.task_id: t for t in ctx.store.list_tasks()}
    actions: list[PruneAction] = []
    for task in tasks.values():
        if _wanted(task, include_unaccepted) and scope.allows(task.repository):
            actions += _task_leftovers(ctx, task)
    actions += _orphans(ctx, tasks, scope)
    actions += _job_scratch(ctx, scope)
    left = trash.leftovers(home)  # folders already removed from every task: any scope's
    if left:
        actions.append(
            PruneAction(
                "trash",
                str(trash.trash_dir(home)),
                None,
                f"{len(left)} removed folder(s) that no background remover is at work on",
            )
        )
    pruning = {a.task_id for a in actions if a.kind == "workspace"}
    actions += _object_caches(ctx, tasks, pruning, scope)
    actions += [
        PruneAction("object_cache", str(folder), None, "base tree no layered checkout uses")
        for folder in unused_bases(home, {a.target for a in actions if a.kind == "orphan_dir"})
    ]
    actions += _pool_slots(ctx)
    actions += _containers(ctx, tasks, scope)
    return actions


def _task_leftovers(ctx: Context, task: TaskRecord) -> list[PruneAction]:
    """A finished task's workspace (worktree, private git dir, CLI home, branch) and, past the
    retention, its artifacts."""
    home, task_id = ctx.home, task.task_id
    repo = Path(task.repository)
    branch = f"worker-bridge/{task_id}"
    worktree = home / "worktrees" / task_id
    actions = []
    if (
        worktree.exists()
        or (home / "gitdirs" / task_id).exists()
        or (ctx.task_dir(task_id) / "home").exists()
        or _branch_exists(repo, branch)
    ):
        kept = _kept_objects(repo, branch, task.base_commit)
        detail = f"{task.status} task: worktree and branch {branch}{kept}"
        actions.append(PruneAction("workspace", str(worktree), task_id, detail))
    cutoff = datetime.now(UTC) - timedelta(days=ctx.config.retention_days)
    finished, task_dir = task.finished_at, ctx.task_dir(task_id)
    if task_dir.exists() and finished and _time(finished) < cutoff:
        detail = f"{task.status} task finished over {ctx.config.retention_days} days ago"
        actions.append(PruneAction("artifacts", str(task_dir), task_id, detail))
    return actions


def _containers(
    ctx: Context, tasks: dict[str, TaskRecord], scope: RepositoryScope
) -> list[PruneAction]:
    """Containers of finished or unknown tasks (one of a task outside the scope is left)."""
    actions = []
    try:
        for item in orphan_containers(ctx):
            owner = item.labels.get("io.worker-bridge.task")
            known = tasks.get(owner) if owner is not None else None
            if known is not None and not scope.allows(known.repository):
                continue
            detail = "container of a finished or unknown task"
            actions.append(PruneAction("container", item.id[:12], owner, detail))
    except BridgeError:
        pass  # no engine reachable: no containers to reclaim from here
    return actions


def _time(at: str) -> datetime:
    return datetime.fromisoformat(at.replace("Z", "+00:00"))


def _orphans(
    ctx: Context, tasks: dict[str, TaskRecord], scope: RepositoryScope
) -> list[PruneAction]:
    home, found = ctx.home, []
    logs = home / "logs"
    if logs.is_dir():
        for entry in sorted(logs.glob("runner-*.log")):
            task_id = entry.name.removeprefix("runner-").removesuffix(".log")
            if task_id not in tasks:
                found.append(
                    PruneAction("orphan_log", str(entry), None, f"no task '{task_id}' in the store")
                )
    for folder in ("worktrees", "gitdirs", "tasks", "layers"):
        root = home / folder
        if root.is_dir():
            for entry in sorted(root.iterdir()):
                if entry.name in tasks:
                    continue
                repo = (
                    _worktree_repository(entry) if scope.bounded and folder == "worktrees" else None
                )
                if repo is not None and not scope.allows(repo):
                    continue  # git in that repository still records it: not ours to change
                found.append(
                    PruneAction(
                        "orphan_dir", str(entry), None, f"no task '{entry.name}' in the store"
                    )
                )
    return found


def _job_scratch(ctx: Context, scope: RepositoryScope) -> list[PruneAction]:
    """What an integrate job's merges wrote (`<home>/jobs/<job>`: objects its step tasks no
    longer need), once the job has ended, or when no job of that id is in the store."""
    root = ctx.home / "jobs"
    if not root.is_dir():
        return []
    jobs = {job.job_id: job for job in ctx.store.jobs.records()}
    found = []
    for entry in sorted(root.iterdir()):
        job = jobs.get(entry.name)
        if job is not None and (job.status not in JOB_TERMINAL or not scope.allows(job.repository)):
            continue
        why = f"{job.status} job: its merges' objects" if job else "no such job in the store"
        found.append(PruneAction("job_scratch", str(entry), None, why))
    return found


def _object_caches(
    ctx: Context,
    tasks: dict[str, TaskRecord],
    pruning: set[str | None],
    scope: RepositoryScope,
) -> list[PruneAction]:
    """Object stores (and attribute-free git dirs) no task with a workspace still needs; under a
    bounded scope, only those of repositories in it."""
    root = ctx.home / "objects"
    if not root.is_dir():
        return []
    mine = {repo_id(Path(t.repository)) for t in tasks.values() if scope.allows(t.repository)}
    live: dict[str, tuple[Path, set[str]]] = {}
    for task in tasks.values():
        if task.pruned_at or task.task_id in pruning or not task.base_commit:
            continue
        if not (ctx.home / "worktrees" / task.task_id).exists() and task.status in RECLAIMABLE:
            continue
        repo = Path(task.repository)
        live.setdefault(repo_id(repo), (repo, set()))[1].add(task.base_commit)
    keep = {
        store for repo, bases in live.values() for store in stores_in_use(ctx.home, repo, bases)
    }
    found = []
    for repo_dir in sorted(root.iterdir()):
        if scope.bounded and repo_dir.name not in mine:
            continue
        for store in sorted(repo_dir.iterdir()):
            if store not in keep:
                size = fs.tree_size([store])
                found.append(
                    PruneAction(
                        "object_cache",
                        str(store),
                        None,
                        f"objects of base {store.name[:12]} ({size / 2**20:.1f} MiB), unused",
                    )
                )
        raw = ctx.home / "rawgit" / repo_dir.name
        if repo_dir.name not in live and raw.exists():
            found.append(
                PruneAction(
                    "object_cache",
                    str(raw),
                    None,
                    "attribute-free git dir of a repository no task uses",
                )
            )
    return found


def apply_prune(ctx: Context, actions: list[PruneAction]) -> list[PruneAction]:
    """Apply each action; one that fails records why and the others go on."""
    for action in actions:
        try:
            action.failed = _apply(ctx, action) or None
        except (OSError, BridgeError) as exc:
            action.failed = [str(exc)]
    return actions


def _apply(ctx: Context, action: PruneAction) -> list[str]:
    if action.kind == "workspace" and action.task_id:
        repo = Path(ctx.store.load_task(action.task_id).repository)
        if repo.is_dir():
            ws = TaskWorkspace.plan(ctx.home, repo, action.task_id)
            failed = remove_workspace(ctx.home, ws, delete_branch=True)
        else:  # the repository is gone: only our own folders are left to remove
            overlay.unmount(Path(action.target))  # layered: never removed through its view
            failed = fs.remove_tree(Path(action.target))
            failed += fs.remove_tree(ctx.home / "gitdirs" / action.task_id)
            failed += fs.remove_tree(ctx.home / "layers" / action.task_id)  # names its base
        # The CLI's home (its sessions) goes with the worktree they were about, and so do the
        # gateway folders a killed runner left (sockets no one listens on).
        failed += fs.remove_tree(ctx.task_dir(action.task_id) / "home")
        for name in (action.task_id, f"{action.task_id}-setup"):
            failed += fs.remove_tree(ctx.home / "gateways" / name)
        if not failed:
            ctx.store.update_task(action.task_id, pruned_at=now_iso())
        return failed
    if action.kind == "artifacts" and action.task_id:
        failed = fs.remove_tree(Path(action.target))
        (ctx.home / "logs" / f"runner-{action.task_id}.log").unlink(missing_ok=True)
        ctx.store.remove_artifacts(action.task_id)
        return failed
    if action.kind == "orphan_dir":
        return _remove_orphan_dir(ctx, Path(action.target))
    if action.kind == "trash":
        return trash.reap(ctx.home)
    if action.kind == "object_cache" and Path(action.target).is_relative_to(bases_root(ctx.home)):
        return remove_unused(ctx.home, Path(action.target))  # unless a task started on it since
    if action.kind in ("orphan_log", "object_cache", "job_scratch"):
        return fs.remove_tree(Path(action.target))
    if action.kind == "container":
        ctx.sandbox.remove(action.target)
    if action.kind == "pool":
        getattr(ctx.sandbox, "drain", list)()
    return []


def _pool_slots(ctx: Context) -> list[PruneAction]:
    """The container pool's slots that serve no task (idle ones, and what a killed process
    left): removed together; the next task refills the pool."""
    rows = getattr(ctx.sandbox, "slot_rows", None)
    spare = [s for s in (rows() if rows else []) if s.state != "running"]
    if not spare:
        return []
    idle = sum(1 for s in spare if s.state == "idle")
    why = f"{len(spare)} pooled container(s) serving no task ({idle} idle)"
    return [PruneAction("pool", str(ctx.home / "pool"), None, why)]


def _remove_orphan_dir(ctx: Context, path: Path) -> list[str]:
    """Remove a folder no task references; if it is a worktree git still knows, also drop the
    repository's record of it and its worker-bridge branch."""
    repo = _worktree_repository(path) if path.parent.name == "worktrees" else None
    overlay.unmount_under(path)
    overlay.unmount(path)  # a layered worktree: never removed through its merged view
    failed = fs.remove_tree(path)
    if repo is not None and repo.is_dir():
        with repository_lock(ctx.home, repo.resolve()):
            git = Git(repo)
            git.run("worktree", "prune", check=False)
            branch = f"worker-bridge/{path.name}"
            if _branch_exists(repo, branch):
                git.run("branch", "-D", "--quiet", branch, check=False)
    return failed


def _worktree_repository(path: Path) -> Path | None:
    """The repository an orphan worktree folder belongs to, when that repository's own record
    names this very folder (a `.git` file a worker planted cannot point prune at some other
    repository); None otherwise."""
    try:
        text = fs.read_small(path / ".git", 4096).decode(errors="replace").strip()
    except OSError:
        return None
    if not text.startswith("gitdir: "):
        return None
    admin = Path(text.removeprefix("gitdir: "))  # <repo>/.git/worktrees/<name>
    try:
        back = fs.read_small(admin / "gitdir", 4096).decode(errors="replace").strip()
    except OSError:
        return None
    ours = admin.parent.name == "worktrees" and Path(back) == path / ".git"
    return admin.parent.parent.parent if ours else None


def prune(
    ctx: Context,
    apply: bool = False,
    include_unaccepted: bool = False,
    scope: RepositoryScope | None = None,
) -> PruneReport:
    actions = plan_prune(ctx, include_unaccepted, scope)
    if apply:
        actions = apply_prune(ctx, actions)
    return PruneReport(applied=apply, actions=[a.document() for a in actions])
