"""Crash recovery, run by any bridge process: a task whose runner died is handed to a new
detached runner (which adopts a live container, collects an exited one, or redoes an unfinished
phase), containers that belong to no live task are removed, and so are the overlay mounts
of tasks that are over or gone (`reclaim_mounts`)."""

from __future__ import annotations

from pathlib import Path

from bridge.models import TERMINAL
from bridge.phase.context import Context
from bridge.pipeline.answer import expire_due
from bridge.pipeline.detached import spawn_runner
from bridge.sandbox import LABEL, ContainerInfo, home_id
from bridge.workspace import overlay
from bridge.workspace.fs import remove_tree


def recover_stranded(ctx: Context) -> list[str]:
    """Spawn a runner for each stranded task; returns their ids. Requests past the input
    timeout expire here too (a waiting task has no process of its own to notice)."""
    expire_due(ctx)
    recovered = []
    for row in ctx.store.runners.stranded():
        if spawn_runner(ctx.config, ctx.store, row["task_id"], replacing=row["runner_id"]):
            ctx.store.add_event(
                row["task_id"], "task.recovering", {"phase": row["phase"], "status": row["status"]}
            )
            recovered.append(row["task_id"])
    return recovered


def orphan_containers(ctx: Context) -> list[ContainerInfo]:
    """Containers of this state root whose task is unknown or already terminal."""
    found = ctx.sandbox.containers({f"{LABEL}.home": home_id(ctx.home)})
    task_ids = [item.labels.get(f"{LABEL}.task", "") for item in found]
    statuses = ctx.store.statuses(task_ids) if task_ids else {}
    return [
        item
        for item, task_id in zip(found, task_ids, strict=True)
        if statuses.get(task_id) is None or statuses[task_id] in TERMINAL
    ]


def remove_orphan_containers(ctx: Context) -> int:
    orphans = orphan_containers(ctx)
    for item in orphans:
        ctx.sandbox.remove(item.id)
    return len(orphans)


def reclaim_mounts(ctx: Context) -> list[str]:
    """Undo what a killed process left mounted: verification checkouts (`<home>/mounts/`) of
    tasks that are over or unknown (a live task's own runner redoes its own), and worktree
    mounts whose layers are gone. Returns the mount points undone."""
    home = ctx.home
    points = [Path(p) for p in overlay.mount_points() if p.startswith(f"{home}/")]
    if not points:
        return []
    mounts, worktrees = home / "mounts", home / "worktrees"
    ids = {p.name.partition(overlay.MOUNT_SEP)[0] for p in points if p.parent == mounts}
    statuses = ctx.store.statuses(sorted(ids)) if ids else {}
    undone = []
    for point in points:
        if point.parent == mounts:
            status = statuses.get(point.name.partition(overlay.MOUNT_SEP)[0])
            stale = status is None or status in TERMINAL
        elif point.parent == worktrees:
            stale = not (home / "layers" / point.name / "upper").is_dir()
        else:
            continue
        if stale:
            overlay.unmount(point)
            if point.parent == mounts and not overlay.mounted(point):
                remove_tree(point)
            undone.append(str(point))
    return undone
