"""Collect: snapshot the worktree on the host as a commit on the task branch, and write the diff
and manifest (base -> snapshot) as the task's artifacts."""

from __future__ import annotations

from dataclasses import dataclass

from bridge.pipeline.handle import PhaseHandle
from bridge.workspace.baseline import Stat, record_files, touched_paths
from bridge.workspace.changes import Change, list_changes, write_diff, write_manifest
from bridge.workspace.worktree import TaskWorkspace, snapshot_worktree


@dataclass
class Collected:
    snapshot: str
    changes: list[Change]


def collect_changes(
    handle: PhaseHandle, ws: TaskWorkspace, baseline: dict[str, Stat] | None = None
) -> Collected:
    """Snapshot and artifacts. Idempotent: a resumed runner may collect again. ``baseline``:
    the worktree's stat record from just before this run's worker started."""
    base, task_id = handle.record.base_commit or "", handle.task_id
    touched = touched_paths(baseline, record_files(ws.worktree)) if baseline else None
    snapshot = snapshot_worktree(ws, base, f"worker-bridge snapshot of task {task_id}", touched)
    changes = list_changes(ws.repository, base, snapshot)
    out = handle.ctx.task_dir(task_id)
    out.mkdir(parents=True, exist_ok=True)
    diff_path, manifest_path = out / "changes.diff", out / "manifest.json"
    store = handle.ctx.store
    size, digest = write_diff(ws.repository, base, snapshot, diff_path)
    store.add_artifact(task_id, "diff", diff_path, size, digest)
    size, digest = write_manifest(changes, base, snapshot, manifest_path)
    store.add_artifact(task_id, "manifest", manifest_path, size, digest)
    return Collected(snapshot, changes)
