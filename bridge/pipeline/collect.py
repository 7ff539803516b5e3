"""Collect: snapshot the worktree on the host as a commit on the task branch (see
`workspace.snapshot` for what is read and what is left out), and write the diff, its readable
form (`workspace.readable`: what git shows as binary given as text) and the manifest (base ->
snapshot) as the task's artifacts. Two halves: `take_snapshot` where the worker's containers ran,
`write_artifacts` on the control host from a commit (a node's comes in a bundle: cluster/)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bridge.config.settings import LimitDefaults
from bridge.documents import BinaryNote
from bridge.errors import DiskFull
from bridge.phase.handle import PhaseHandle
from bridge.workspace import fs
from bridge.workspace.baseline import Stat
from bridge.workspace.diff import Change, ChangedEntry, list_changes, write_diff, write_manifest
from bridge.workspace.modes import disarm_all
from bridge.workspace.readable import write_readable
from bridge.workspace.snapshot import Dropped, Snapshot, SnapshotLimits, snapshot_worktree
from bridge.workspace.worktree import TaskWorkspace

MAX_DROPPED_REPORTED = 200


class CollectTimedOut(Exception):
    """The deadline passed while the worker's files were being read."""


def _stop_check(handle: PhaseHandle) -> None:
    """Reading what the worker wrote happens under the task's deadline, and a cancel ends it."""
    handle.ensure_active()
    if handle.remaining() <= 0:
        raise CollectTimedOut()


@dataclass
class Collected:
    snapshot: str
    changes: list[Change]
    dropped: list[Dropped]
    binary: dict[str, BinaryNote] = field(default_factory=dict)  # by path: git shows as binary

    def changed_files(self) -> list[ChangedEntry]:
        """The changed paths as the result lists them, a binary one with its note."""
        entries = [c.result_entry() for c in self.changes]
        for change, entry in zip(self.changes, entries, strict=True):
            if change.path in self.binary:
                entry["binary"] = self.binary[change.path]
        return entries

    @property
    def made_binary(self) -> list[str]:
        """The paths the change made binary (new, or text in the base, and holding a NUL)."""
        return [path for path, note in self.binary.items() if note["holds_nul"]]


def disarm_workspace(handle: PhaseHandle, ws: TaskWorkspace, *, worktree: bool = True) -> None:
    """Clear the set-user-id and set-group-id bits, and remove the devices, the worker left in
    its private git dir and CLI home, and (``worktree``) in its worktree: whatever stays on the
    host after a turn is nobody's way to the worker's uid (bridge/workspace/modes.py). The
    worktree's own are cleared by the snapshot, which reads its files' modes anyway; a turn that
    ends without one (a disk limit passed, the deadline) has it walked here (a layered one's
    upper dir only: the base's files hold no such bit)."""
    roots: list[tuple[Path, Iterable[tuple[str, int]] | None]] = [
        (ws.private_gitdir, None),
        (handle.ctx.task_dir(handle.task_id) / "home", None),  # the CLI's (worker_turn.cli_home)
    ]
    if worktree:
        upper = ws.upper
        walked = fs.walk_all(upper if upper is not None else ws.worktree, strict=False)
        roots.append((ws.worktree, ((rel, st.st_mode) for rel, st in walked if rel != ".git")))
    disarm_all(roots)  # each of them, even when one is too deep to walk (DiskFull after)


def collect_changes(
    handle: PhaseHandle, ws: TaskWorkspace, start: str, baseline: dict[str, Stat] | None
) -> Collected:
    """Snapshot and artifacts. ``start``: the commit whose tree the turn began from (the base,
    or the previous turn's snapshot); ``baseline``: the worktree's stat record from just before
    this turn's worker started (None: every file is compared). Idempotent."""
    snapshot = take_snapshot(handle, ws, start, baseline)
    return write_artifacts(handle, ws.repository, snapshot)


def snapshot_limits(limits: LimitDefaults) -> SnapshotLimits:
    """What a snapshot may hold, from the task's limits (here, and for a node's: bundles)."""
    return SnapshotLimits(
        file_bytes=limits.file_mb * 2**20,
        change_bytes=limits.change_mb * 2**20,
        entries=limits.files,
    )


def take_snapshot(
    handle: PhaseHandle, ws: TaskWorkspace, start: str, baseline: dict[str, Stat] | None
) -> Snapshot:
    """The worktree committed to the task's branch (where its containers ran: a node's own
    collect is this too), its set-user-id bits cleared; DiskFull past a limit."""
    base, task_id = handle.record.base_commit or "", handle.task_id
    try:
        disarm_workspace(handle, ws, worktree=False)  # the worktree's files: in the snapshot
        snapshot = snapshot_worktree(
            ws,
            base,
            start,
            f"worker-bridge snapshot of task {task_id}",
            snapshot_limits(handle.limits),
            baseline,
            stop=lambda: _stop_check(handle),
            timeout=max(handle.remaining(), 1.0),
        )
    except DiskFull:
        # Refused before its files were looked at (more than `limits.files`, a tree too deep
        # here or in the git dir): the worktree is walked for its bits all the same, as deep as
        # a walk goes.
        with contextlib.suppress(DiskFull):
            disarm_workspace(handle, ws)
        raise
    if snapshot.dropped:
        handle.emit(
            "workspace.dropped",
            {"paths": [d.document() for d in snapshot.dropped[:MAX_DROPPED_REPORTED]]},
        )
    return snapshot


def write_artifacts(handle: PhaseHandle, repository: Path, snapshot: Snapshot) -> Collected:
    """The change from the base to ``snapshot`` (a commit in ``repository``) as the task's
    artifacts on the control host: its diff, its readable diff and its manifest."""
    base, task_id = handle.record.base_commit or "", handle.task_id
    changes = list_changes(repository, base, snapshot.commit)
    out = handle.ctx.task_dir(task_id)
    out.mkdir(parents=True, exist_ok=True)
    diff_path, manifest_path = out / "changes.diff", out / "manifest.json"
    store = handle.ctx.store
    size, digest = write_diff(repository, base, snapshot.commit, diff_path)
    store.add_artifact(task_id, "diff", diff_path, size, digest)
    readable = write_readable(
        repository, base, snapshot.commit, diff_path, out / "readable.diff", changes
    )
    store.add_artifact(task_id, "readable", readable.path, readable.size, readable.sha256)
    size, digest = write_manifest(changes, base, snapshot.commit, manifest_path)
    store.add_artifact(task_id, "manifest", manifest_path, size, digest)
    return Collected(snapshot.commit, changes, snapshot.dropped, readable.binary)
