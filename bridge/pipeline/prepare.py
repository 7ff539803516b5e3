"""Prepare (the `allocating` phase): the task's worktree on its branch and the container's private
git dir, made from nothing (a half-made one a dead runner left is swept first)."""

from __future__ import annotations

import time

from bridge.phase.handle import PhaseHandle
from bridge.workspace.disk import check_free_space
from bridge.workspace.worktree import (
    TaskWorkspace,
    create_workspace,
    ensure_mounted,
    remove_workspace,
)


def prepare_workspace(handle: PhaseHandle, ws: TaskWorkspace, *, sweep: bool) -> None:
    handle.enter_phase("allocating")
    ctx = handle.ctx
    t0 = time.monotonic()
    check_free_space(ctx.home, ctx.config.disk_reserve_gb)
    if sweep:  # a runner died half way through: start the workspace again from nothing
        remove_workspace(ctx.home, ws, delete_branch=True)
    handle.update(worktree=str(ws.worktree), branch=ws.branch)
    _, owner = ctx.sandbox_identity()
    layered = create_workspace(
        ctx.home,
        ws,
        handle.record.base_commit or "",
        owner,
        timeout=ctx.config.allocation_timeout_s,
        layered=ctx.config.layered_checkouts,
    )
    handle.timed("prepare_s", t0)
    handle.emit(
        "workspace.ready",
        {
            "worktree": str(ws.worktree),
            "branch": ws.branch,
            # which way it was made: an overlay over the base's cached tree, or a full checkout
            "checkout": "layered" if layered else "full",
        },
    )


def remount_workspace(handle: PhaseHandle, ws: TaskWorkspace) -> None:
    """A later phase of a task whose layered worktree lost its mount (a reboot, a reclaim): the
    same layers mounted again, what the task wrote kept in its upper dir."""
    owner = handle.ctx.sandbox_identity()[1]
    ensure_mounted(handle.ctx.home, ws, handle.record.base_commit or "", owner)
