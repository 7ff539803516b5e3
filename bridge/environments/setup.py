"""Making a task's environment ready: its image (the user's, or built from the devcontainer's
Dockerfile), the worker's bundle and probe, and the setup's result from the cache or from a
setup run (bridge/environments/run.py).

Which result a task may use:
- for its base commit, the shared entry of its key, if that entry was made from the base commit
  or one of its ancestors (a task on a contributor's branch may read main's entry, but what it
  makes is never read by main: it sets up task-privately instead);
- for a snapshot whose dependency files the worker changed, a task-private setup of the
  snapshot, run as the sandbox user on the base's read-only image (its scripts are the worker's
  code: they can write only the repository and /tmp, never the tools verification runs), with
  no more network than the task's own policy allows of `setup_network`.
Task-private results live in the task's folder and go with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from subprocess import SubprocessError
from typing import TYPE_CHECKING

from bridge.documents import EnvironmentDoc
from bridge.environments.bundle import check_worker_runs, worker_bundle
from bridge.environments.cache import (
    Entry,
    cache_root,
    check_entry,
    image_tag,
    key_lock,
    load_entry,
    remove_entry,
    seal_view,
    sealed_files,
    sealed_view,
    setup_key,
    sweep_partials,
)
from bridge.environments.definition import (
    EnvDefinition,
    key_files,
    key_files_after,
    resolve_definition,
    tree_files,
)
from bridge.environments.digest import FilesCheck
from bridge.environments.image import environment_image
from bridge.environments.ready import Ready, SetupPlan
from bridge.environments.run import SetupTimedOut, run_setup
from bridge.environments.sealed import SealBroken
from bridge.errors import BridgeError, EnvironmentFailed, InvalidSpec
from bridge.phase.handle import PhaseHandle
from bridge.workers import Worker
from bridge.workspace.fs import display
from bridge.workspace.git import Git
from bridge.workspace.overlay import overlay_usable
from bridge.workspace.rawgit import raw_git

if TYPE_CHECKING:
    from bridge.workspace.diff import Change

__all__ = [
    "Ready",
    "SetupTimedOut",
    "SnapshotSetupFailed",
    "confirmed",
    "definition_for",
    "for_snapshot",
    "prepare_environment",
    "unsealed",
]


def definition_for(handle: PhaseHandle) -> EnvDefinition | None:
    record = handle.record
    try:
        return resolve_definition(
            handle.ctx.config, record.spec, Git(record.repository), record.base_commit or ""
        )
    except InvalidSpec as exc:
        raise EnvironmentFailed(exc.message) from exc


def prepare_environment(handle: PhaseHandle, worker: Worker, definition: EnvDefinition) -> Ready:
    """The environment for the task's base commit (the shared cache, or a setup run)."""
    image, image_env, image_id = environment_image(handle, definition)
    bundle = worker_bundle(handle, worker.image(handle.ctx.config))
    check_worker_runs(handle, worker, image, image_id, image_env, bundle)
    ready = Ready(definition, image, image_id, image_env, bundle, None, {}, None, "none", (), image)
    if not definition.setup:
        return ready
    base = handle.record.base_commit or ""
    files = key_files(definition, tree_files(_git(handle), base))
    return _set_up(handle, ready, base, files, mode="shared")


def for_snapshot(
    handle: PhaseHandle,
    base: Ready,
    snapshot: str,
    trusted: str | None = None,
    changes: list[Change] | None = None,
) -> tuple[Ready, list[str]]:
    """The environment verification of ``snapshot`` needs: the base's when the snapshot's
    dependency files are the base's; the shared setup of ``trusted`` (a commit of the user's,
    such as the HEAD accept merges onto) when they are that commit's; else a task-private setup
    of the snapshot (see the module's docstring). Also the dependency files that changed.
    ``changes``: base -> snapshot when known (the snapshot's files then follow from them)."""
    if base.key is None:
        return base, []
    git = _git(handle)
    if changes is not None and base.commit == handle.record.base_commit:
        files = key_files_after(base.definition, base.files, changes)
    else:
        files = key_files(base.definition, tree_files(git, snapshot))
    if files == base.files:
        return base, []
    changed = sorted(p for p in set(files) | set(base.files) if files.get(p) != base.files.get(p))
    shown = [handle.redactor.redact(display(p)) for p in changed]
    if trusted is not None and files == key_files(base.definition, tree_files(git, trusted)):
        template = replace(base, image=base.environment_image)
        return _set_up(handle, template, trusted, files, mode="shared"), shown
    info = handle.ctx.sandbox.inspect_image(base.image)
    if info is None:
        raise EnvironmentFailed(f"The environment's image {base.image} went away; run it again.")
    template = replace(base, image_id=info.id)
    reason = f"the worker changed {', '.join(shown[:5])}"
    try:
        return _set_up(handle, template, snapshot, files, mode="snapshot", reason=reason), shown
    except EnvironmentFailed as exc:
        document = base.document(shown).model_copy(update={"setup": "failed_for_snapshot"})
        raise SnapshotSetupFailed(exc.message, kind=exc.kind, document=document) from exc


class SnapshotSetupFailed(EnvironmentFailed):
    """The setup of the worker's snapshot failed: its verification failed (``document``: the
    result's `verification.environment`)."""

    def __init__(self, message: str, *, kind: str | None, document: EnvironmentDoc) -> None:
        super().__init__(message, kind=kind)
        self.document = document


# -- setup and the cache --------------------------------------------------------------------


def _set_up(
    handle: PhaseHandle,
    template: Ready,
    commit: str,
    files: dict[str, str],
    *,
    mode: str,
    reason: str = "no cache entry",
) -> Ready:
    """``template`` with the setup's result for ``commit``: the shared entry (``mode``
    "shared": reused when it may be, else made, shared or task-private), or a task-private
    setup of the worker's snapshot ("snapshot")."""
    ctx, definition = handle.ctx, template.definition
    network = definition.setup_network if mode == "shared" else _task_allows(handle, definition)
    key = setup_key(
        template.image_id,
        definition.setup,
        definition.container_env,
        network,
        files,
        repository=handle.record.repository,
    )
    ready = replace(template, key=key, files=files, commit=commit, check=None, sealed=None)
    private = ctx.task_dir(handle.task_id) / "environments" / key
    if mode == "snapshot":  # run in the base's image, never committed
        plan = SetupPlan(key, files, commit, private, template.image, network, True, reason)
        return _use(ready, run_setup(handle, ready, plan), "ran")

    shared = cache_root(ctx.home) / key
    # one setup per key, all processes together
    with key_lock(ctx.home, key, wait=partial(_waiting, handle)):
        entry = load_entry(shared)
        why = "its record is unreadable" if shared.exists() and entry is None else None
        if entry is not None:
            why, sealed = check_entry(entry, _image_id_of(handle)), None
            if why is None:
                try:
                    sealed = _sealed(handle, entry)
                except SealBroken as exc:
                    why = str(exc)
            if why is None and _contains(handle, commit, str(entry.record.get("commit"))):
                entry.touch()
                data = {"key": key, "image": entry.image, "files": entry.record.get("files")}
                handle.emit("environment.cached", {**data, "sealed": sealed is not None})
                cached = _use(ready, entry, "cached")
                if sealed is not None:
                    return replace(cached, sealed=sealed)
                return replace(cached, check=FilesCheck(entry))
            if why is None:  # made from a commit the base does not contain: not ours to read
                reason = "the cached setup was made from a commit this base does not contain"
                tag = image_tag(ctx.home, key, handle.task_id)
                plan = SetupPlan(key, files, commit, private, tag, network, False, reason)
                return _use(ready, run_setup(handle, ready, plan), "ran")
        if why is not None:
            handle.emit("environment.cache_corrupt", {"key": key, "reason": why})
            remove_entry(
                shared, entry.image if entry else image_tag(ctx.home, key), ctx.sandbox.remove_image
            )
            reason = f"the cache entry could not be trusted ({why})"
        sweep_partials(ctx.home)
        plan = SetupPlan(
            key, files, commit, shared, image_tag(ctx.home, key), network, False, reason
        )
        return _use(ready, run_setup(handle, ready, plan), "ran")


def confirmed(handle: PhaseHandle, ready: Ready) -> Ready:
    """``ready`` once its cached files have passed their check (`FilesCheck`, started when the
    entry was picked). When they failed, the entry is removed (if no other process has made it
    again meanwhile) and set up again: what the worker ran on is the worker's business, what
    verification runs on is the host's."""
    failures, wait = 0, partial(_waiting, handle)
    if ready.sealed is not None:
        try:
            sealed_files(handle.ctx.home, ready.sealed)  # checked again, and mounted
        except OSError:  # gone, changed or unmountable since it was picked: checked whole
            ready = unsealed(ready)
    while ready.check is not None:
        check = ready.check
        why = check.result(wait)
        if why is None:
            if _layered(handle):  # checked whole: later tasks check its sealed image alone
                _seal(handle, check.entry)
            return replace(ready, check=None)
        ctx, entry = handle.ctx, check.entry
        handle.emit("environment.cache_corrupt", {"key": entry.key, "reason": why})
        with key_lock(ctx.home, entry.key, wait=wait):
            current = load_entry(entry.folder)
            if current is not None and current.record == entry.record:
                remove_entry(entry.folder, entry.image, ctx.sandbox.remove_image)
        failures += 1
        if failures == 2:  # another process's entry, made again, failed as well
            raise EnvironmentFailed(
                "The environment's cache entry failed its check twice in a row; something on "
                "this host is changing it: see `worker-bridge environments list`, then run the "
                "task again."
            )
        template = replace(ready, image=ready.environment_image, check=None)
        reason = f"the cache entry could not be trusted ({why})"
        ready = _set_up(handle, template, ready.commit, ready.files, mode="shared", reason=reason)
    return ready


def _layered(handle: PhaseHandle) -> bool:
    """Whether this task's checkouts are layered (where a view of the cached files is used)."""
    ctx = handle.ctx
    return ctx.config.layered_checkouts and overlay_usable(ctx.home)


def _sealed(handle: PhaseHandle, entry: Entry) -> Path | None:
    """The sealed view ``entry``'s files reach this task as, checked by its image's identity
    alone (sealed.py), or None; SealBroken when that image is not the one sealed."""
    if not _layered(handle):
        return None
    return sealed_view(handle.ctx.home, entry, handle.ctx.sandbox_identity()[1])


def _seal(handle: PhaseHandle, entry: Entry) -> None:
    """Seal the view of ``entry`` (its files just checked whole); best effort: a task whose
    check passed never fails for it (the next task checks the entry whole again)."""
    try:
        seal_view(handle.ctx.home, entry, handle.ctx.sandbox_identity()[1])
    except (BridgeError, OSError, SubprocessError):
        pass


def unsealed(ready: Ready) -> Ready:
    """``ready`` without its sealed view (gone, changed or unmountable since it was picked):
    its entry's files checked whole, as a task without one (`confirmed` waits for it)."""
    assert ready.outputs is not None
    entry = load_entry(ready.outputs.parent)
    if entry is None:  # gone as well: a check that fails, so that it is set up again
        entry = Entry(ready.key or "", ready.outputs.parent, {"digest": ""})
    return replace(ready, sealed=None, check=FilesCheck(entry))


def _waiting(handle: PhaseHandle) -> None:
    """While the task waits (another process's setup of its key, its entry's check): give up on
    a cancel or the deadline."""
    handle.ensure_active()
    if handle.remaining() <= 0:
        raise SetupTimedOut("The task's deadline passed while it waited for a setup.")


def _use(ready: Ready, entry: Entry, how: str) -> Ready:
    paths = tuple(entry.record.get("paths") or ())
    return replace(ready, image=entry.image, outputs=entry.outputs, setup=how, paths=paths)


def _task_allows(handle: PhaseHandle, definition: EnvDefinition) -> tuple[str, ...]:
    """What a setup of the worker's files may reach: `setup_network`, as far as the task's own
    network policy allows it (`none`: nothing; an allowlist: the names on both)."""
    network = handle.spec.network
    if network.mode != "allowlist":
        return ()
    from bridge.gateway.policy import name_allowed

    allowed = [d.lower().rstrip(".") for d in network.domains]
    # A name the task's allowlist covers; a pattern only if the allowlist names it too.
    return tuple(
        d
        for d in definition.setup_network
        if d in allowed or (not d.startswith("*.") and name_allowed(d, allowed))
    )


def _contains(handle: PhaseHandle, commit: str, made_from: str) -> bool:
    """Whether ``made_from`` is ``commit`` or one of its ancestors."""
    if made_from == commit:
        return True
    proc = _git(handle).run("merge-base", "--is-ancestor", made_from, commit, check=False)
    return proc.returncode == 0


def _image_id_of(handle: PhaseHandle) -> Callable[[str], str | None]:
    def find(ref: str) -> str | None:
        info = handle.ctx.sandbox.inspect_image(ref)
        return info.id if info else None

    return find


def _git(handle: PhaseHandle) -> Git:
    """Git on the attribute-free git dir: the repository's objects, and the trees accept
    merges there (a re-verification's tree exists only in it)."""
    return raw_git(handle.ctx.home, Path(handle.record.repository))
