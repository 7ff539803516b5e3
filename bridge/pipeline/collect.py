"""Collect: snapshot the worktree on the host as a commit on the task branch, and write the diff
and manifest (base -> snapshot) as the task's artifacts."""

from __future__ import annotations

from typing import Any

from bridge.pipeline.context import Context
from bridge.workspace.baseline import Stat, record_files, touched_paths
from bridge.workspace.changes import Change, list_changes, write_diff, write_manifest
from bridge.workspace.worktree import TaskWorkspace, snapshot_worktree


def collect_changes(
    ctx: Context, ws: TaskWorkspace, task: dict[str, Any], baseline: dict[str, Stat] | None = None
) -> tuple[str, list[Change]]:
    """Returns (snapshot commit, changes). Idempotent: a resumed runner may collect again.
    ``baseline``: the worktree's stat record from just before this run's worker started."""
    base, task_id = task["base_commit"], task["task_id"]
    touched = touched_paths(baseline, record_files(ws.worktree)) if baseline else None
    snapshot = snapshot_worktree(ws, base, f"worker-bridge snapshot of task {task_id}", touched)
    changes = list_changes(ws.repository, base, snapshot)
    out = ctx.task_dir(task_id)
    out.mkdir(parents=True, exist_ok=True)
    diff_path, manifest_path = out / "changes.diff", out / "manifest.json"
    size, digest = write_diff(ws.repository, base, snapshot, diff_path)
    ctx.store.add_artifact(task_id, "diff", diff_path, size, digest)
    size, digest = write_manifest(changes, base, snapshot, manifest_path)
    ctx.store.add_artifact(task_id, "manifest", manifest_path, size, digest)
    return snapshot, changes
