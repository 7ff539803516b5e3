"""Crash recovery, run by any bridge process: a task whose runner died is handed to a new
detached runner (which adopts a live container, collects an exited one, or redoes an unfinished
phase), and containers that belong to no live task are removed."""

from __future__ import annotations

from bridge.models import TERMINAL
from bridge.phase.context import Context
from bridge.pipeline.answer import expire_due
from bridge.pipeline.detached import spawn_runner
from bridge.sandbox import LABEL, ContainerInfo, home_id


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
