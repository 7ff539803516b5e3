"""Accept: write a task's verified change into the user's working tree as uncommitted changes.

What is written is exactly what was verified: the snapshot's blobs, byte for byte (see
`workspace.writer`). When the user's HEAD moved past the task's base, the change is applied to
the current HEAD (`git apply --cached` in the attribute-free git dir, so nothing is written to
the user's object store), the verification commands run again on that tree in a clean
container, and the files are written only if they pass (`reverify=False` skips this; the result
then says the change is unverified on that HEAD).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bridge.environments.task import TaskEnvironment
from bridge.errors import EnvironmentFailed
from bridge.host.heap import collections_paused
from bridge.models import Status
from bridge.phase.context import Context
from bridge.phase.handle import PhaseHandle
from bridge.pipeline.outcomes import approved_paths
from bridge.pipeline.results import redactor_for
from bridge.pipeline.scheduling import HEARTBEAT_EVERY, LEASE_TTL, wait_for_leases
from bridge.pipeline.verify import FreshCheckouts, VerificationOutcome, run_commands
from bridge.records import AcceptResult, CommandResult, TaskRecord, VerificationDoc
from bridge.store.db import now_iso
from bridge.store.owners import Owner
from bridge.workers import get_worker
from bridge.workspace.accept import (
    check_entries,
    check_written,
    dirty_paths,
    entries_of_changes,
    escaping_symlink,
    target_entries,
    tracked_paths,
)
from bridge.workspace.diff import Change, list_changes, protected_violations
from bridge.workspace.fs import display
from bridge.workspace.git import Git
from bridge.workspace.locks import repository_lock
from bridge.workspace.rawgit import object_format, raw_git
from bridge.workspace.trash import discard, later
from bridge.workspace.worktree import TaskWorkspace, remove_workspace
from bridge.workspace.writer import BlobReader, Entry, Refused, Writer


def accept_task(
    ctx: Context,
    record: TaskRecord,
    diff: Path,
    *,
    allow_unverified: bool = False,
    reverify: bool = True,
) -> AcceptResult:
    task_id = record.task_id

    def refused(reason: str, kind: str) -> AcceptResult:
        return AcceptResult(accepted=False, task_id=task_id, reason=reason, kind=kind)

    if record.status != Status.SUCCEEDED:
        return refused(
            f"Task {task_id} is {record.status}; only a succeeded task can be accepted.", "status"
        )
    ok = record.verification.ok if record.verification else None
    if ok is not True and not allow_unverified:
        return refused(
            f"Task {task_id} was not verified (it has no verify commands); review "
            "its diff and accept with --allow-unverified.",
            "unverified",
        )
    try:
        return _accept(ctx, record, diff, reverify)
    except Refused as exc:
        return refused(str(exc), exc.kind)


def _accept(ctx: Context, record: TaskRecord, diff: Path, reverify: bool) -> AcceptResult:
    """Listing, checking and writing pause the collector (`collections_paused`): their lists
    hold every changed path and live to the end. Nothing else is paused: the wait for the
    repository lock, verifying again on a moved HEAD, the store, the removal."""
    repo = Path(record.repository)
    base, snapshot = record.base_commit or "", record.snapshot_commit or ""
    with collections_paused():
        changes = list_changes(repo, base, snapshot, sizes=False)
        # Checked again here, from the store: only the paths approved for this task may differ.
        allowed = approved_paths(ctx.store, record.task_id)
        hits = protected_violations(changes, record.spec.verification.protected_paths, allowed)
    if hits:
        raise Refused(
            f"Refusing to accept: task {record.task_id} changed protected path "
            f"'{display(hits[0])}' (verification.protected_paths), which no approved request "
            "allows; nothing was written.",
            "protected_path",
        )
    head = Git(repo).resolve_commit("HEAD")
    raw = raw_git(ctx.home, repo)
    target, reverified, verification = snapshot, None, None
    if head != base:
        target = _merged_tree(ctx, record, raw, head, diff)
        commands = record.spec.verification.commands
        if reverify and commands:
            outcome = _reverify(ctx, record, target, head)
            verification = outcome.document()
            if not outcome.ok:
                bad = outcome.first_failure
                what = f"`{bad.command}` {_how(bad)}" if bad else "the commands did not all run"
                raise Refused(
                    f"Refusing to accept: on the current HEAD {head[:12]} (the task started from "
                    f"{base[:12]}), verification failed: {what}; nothing was written.",
                    "verification_failed",
                )
        reverified = bool(reverify and commands)
    return _write(ctx, record, raw, changes, head, target, reverified, verification)


def _entries_to_write(
    raw: Git, target: str, changes: list[Change], repo: Path, snapshot: str
) -> list[Entry]:
    """``target``'s entries for the changed paths (the snapshot's own come with the diff; a
    merged tree is looked up); Refused when one is a symlink pointing out of the repository."""
    with collections_paused():
        escape = escaping_symlink(raw, target, changes, repo)
        entries = (
            entries_of_changes(changes)
            if target == snapshot
            else target_entries(raw, target, {p for change in changes for p in change.paths})
        )
    if escape:
        raise Refused(
            f"Refusing to accept: symlink '{display(escape[0])}' points outside the "
            f"repository ('{escape[1]}').",
            "symlink_escape",
        )
    return entries


def _write(
    ctx: Context,
    record: TaskRecord,
    raw: Git,
    changes: list[Change],
    head: str,
    target: str,
    reverified: bool | None,
    verification: VerificationDoc | None,
) -> AcceptResult:
    """``target``'s entries for the changed paths written into the user's tree, checked, and
    the task marked accepted; everything put back on any failure."""
    repo, home = Path(record.repository), ctx.home
    entries = _entries_to_write(raw, target, changes, repo, record.snapshot_commit or "")
    with repository_lock(home, repo):
        if Git(repo).resolve_commit("HEAD") != head:
            raise Refused(
                f"Refusing to accept: HEAD of {repo} moved while task {record.task_id} was being "
                "accepted; accept again."
            )
        algorithm = object_format(repo)
        backup = ctx.task_dir(record.task_id) / "accept-backup"
        with collections_paused():
            tracked = tracked_paths(repo)
            check_entries(repo, entries, dirty_paths(repo), tracked)
        writer = Writer(repo, backup, tracked, algorithm=algorithm)
        blobs = BlobReader(raw)
        try:
            with collections_paused():
                writer.apply(entries, blobs)
                limit = record.limits.file_mb * 2**20
                wrong = check_written(repo, entries, writer.written, algorithm, limit)
            if wrong is not None:
                raise Refused(
                    f"Refusing to accept: '{display(wrong)}' did not match the verified snapshot "
                    "after writing; every file was put back."
                )
            if not ctx.store.transition(
                record.task_id,
                Status.ACCEPTED,
                expect={Status.SUCCEEDED},
                event={"applied": len(entries), "head": head, "reverified": reverified},
                finished_at=now_iso(),
            ):
                raise Refused(
                    f"Task {record.task_id} changed status while accepting; check it again.",
                    "status",
                )
        except BaseException:
            writer.undo()
            raise
        finally:
            blobs.close()
        writer.commit()
    applied = [display(e.path) for e in entries]
    ctx.store.add_event(record.task_id, "task.accepted", {"files": applied[:1000], "head": head})
    # Accept is done once the files are written and the task is accepted: nothing uses its
    # worktree again, which is unmounted and handed to the background remover off the answer's
    # path (workspace/trash.py).
    ws = TaskWorkspace.plan(home, repo, record.task_id)
    later(lambda: remove_workspace(home, ws, defer=True))
    return AcceptResult(
        accepted=True,
        task_id=record.task_id,
        applied=applied,
        head=head,
        reverified=reverified,
        verification=verification,
    )


def _how(command: CommandResult) -> str:
    if command.status == "not_run":
        return "did not run"
    if command.status == "timed_out":
        return "passed the deadline"
    return f"exited with status {command.exit_code}"


def _merged_tree(ctx: Context, record: TaskRecord, raw: Git, head: str, diff: Path) -> str:
    """The tree of HEAD with the task's change applied, made in the attribute-free git dir."""
    index = ctx.task_dir(record.task_id) / "accept.index"
    index.parent.mkdir(parents=True, exist_ok=True)
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        raw.run("read-tree", head, env=env)
        proc = raw.run(
            "apply", "--cached", "--binary", "--whitespace=nowarn", str(diff), env=env, check=False
        )
        if proc.returncode != 0:
            detail = proc.stderr.decode(errors="replace").strip().splitlines()
            raise Refused(
                f"Refusing to accept: the snapshot no longer applies to HEAD {head[:12]} of "
                f"{record.repository} ({detail[0] if detail else 'git apply failed'}); the "
                "repository moved since the task's base commit."
            )
        return raw.out("write-tree", env=env)
    finally:
        index.unlink(missing_ok=True)


def _reverify(ctx: Context, record: TaskRecord, tree: str, head: str) -> VerificationOutcome:
    """The task's verification commands on ``tree``, in clean containers, holding leases like
    any task container, under a fresh deadline of the task's timeout."""
    run_ctx = ctx.with_config(record.config)
    store = ctx.store

    def wanted() -> bool:  # accept's checks are wanted while the task is still `succeeded`
        return store.status(record.task_id) == Status.SUCCEEDED

    handle = PhaseHandle(
        task_id=record.task_id,
        record=record,
        ctx=run_ctx,
        redactor=redactor_for(record),
        deadline_at=time.time() + record.limits.timeout_seconds,
        wanted=wanted,
    )
    owner = Owner()
    if not wait_for_leases(store, record, owner, still_wanted=wanted, ahead_of_queue=True):
        raise Refused(
            f"Task {record.task_id} changed status while accepting; check it again.", "status"
        )
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_EVERY):
            store.runners.heartbeat(record.task_id, owner, LEASE_TTL)

    threading.Thread(target=beat, name="accept-heartbeat", daemon=True).start()
    scratch = run_ctx.task_dir(record.task_id) / "reverify"
    env = TaskEnvironment(handle, lambda: get_worker(run_ctx.config, record.spec.worker))
    try:
        discard(ctx.home, scratch)
        scratch.mkdir(parents=True)
        # The task's environment for the merged tree's dependency files (setup again when
        # they are not the base's), else the verification image.
        try:
            commands = record.spec.verification.commands  # each on a full checkout
            ready, env_doc = env.for_verification(tree, None, trusted=head, full=len(commands))
        except EnvironmentFailed as exc:
            raise Refused(
                f"Refusing to accept: the environment for the current HEAD {tree[:12]} could "
                f"not be made ready ({exc.message}); nothing was written.",
                "environment",
            ) from exc
        image = record.spec.verification.image or run_ctx.config.verify_image_ref
        image = ready.image if ready is not None else image
        handle.emit("accept.reverifying", {"tree": tree, "image": image})
        checkouts = FreshCheckouts(handle, tree, scratch, env=ready)
        outcome = run_commands(
            handle, checkouts, record.spec.verification.commands, image, "accept"
        )
        outcome.environment = env_doc
        handle.emit("accept.reverified", {"ok": outcome.ok})
        return outcome
    finally:
        env.discard()
        stop.set()
        store.leases.release(record.task_id, owner)
        discard(ctx.home, scratch)
