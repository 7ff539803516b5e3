"""The project environments as the pipeline sees them: the one module of this package it imports.

`TaskEnvironment` is the environment phase, between allocating and the worker: the task's
environment made ready (its image, the worker's bundle, the setup's result from the cache or a
setup run) and the setup's ignored files put into the new worktree. Verification asks again for
the snapshot: when the worker changed a dependency file, setup runs for it. The rest is what the
phases need besides: `Ready`, `materialize` (the cached files into a checkout), the bundle's
mount point and the setup's errors; and, for task creation, `check_environment`: what a spec's
environment names is allowed and present, and for the verbs that run more of a task
`check_images`: what it names is still allowed."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

from bridge.config.settings import Config
from bridge.documents import EnvironmentDoc
from bridge.environments.bundle import BUNDLE
from bridge.environments.cache import (
    Entry,
    entries_in,
    files_source,
    materialize,
    remove_entry,
    view_tree,
)
from bridge.environments.definition import EnvDefinition, read_blob, resolve_definition
from bridge.environments.devcontainer import DevcontainerBuild
from bridge.environments.dockerfile import dockerfile_images
from bridge.environments.ready import Ready
from bridge.environments.setup import (
    SetupTimedOut,
    SnapshotSetupFailed,
    confirmed,
    definition_for,
    for_snapshot,
    prepare_environment,
    unsealed,
)
from bridge.errors import BridgeError, InvalidSpec
from bridge.models import TaskSpec
from bridge.phase.handle import PhaseHandle
from bridge.sandbox import Sandbox
from bridge.scope import check_image
from bridge.workers import Worker
from bridge.workspace.diff import Change
from bridge.workspace.fs import display, remove_tree
from bridge.workspace.git import Git
from bridge.workspace.worktree import TaskWorkspace, layer_under

__all__ = [
    "BUNDLE",
    "Ready",
    "SetupTimedOut",
    "SnapshotSetupFailed",
    "TaskEnvironment",
    "add_cached_files",
    "view_tree",
]


def add_cached_files(handle: PhaseHandle, outputs: Path, sealed: Path | None, dest: Path) -> None:
    """An entry's cached files into the full checkout ``dest`` (after its chown: the files are
    the cache's): linked from the entry, or copied from its sealed view (`files_source`)."""
    owner = handle.ctx.sandbox_identity()[1]
    materialize(files_source(handle.ctx.home, outputs, sealed), dest, owner)


class TaskEnvironment:
    """One runner's view of its task's environment (None everywhere: the generic images)."""

    def __init__(self, handle: PhaseHandle, worker: Callable[[], Worker]) -> None:
        self.handle, self.worker = handle, worker  # the worker, resolved on first use
        self._ready: Ready | None = None

    @cached_property
    def definition(self) -> EnvDefinition | None:
        """Resolved as at creation (same base commit, recorded spec and configuration)."""
        return definition_for(self.handle)

    def ready(self) -> Ready | None:
        """The environment for the base commit (asked of the cache once per runner)."""
        if self.definition is None:
            return None
        if self._ready is None:
            t0 = time.monotonic()
            self._ready = prepare_environment(self.handle, self.worker(), self.definition)
            self.handle.timed("environment_s", t0)
        return self._ready

    def given(self) -> tuple[Path, Path | None] | None:
        """The cached files the worker was given, as (outputs, sealed view), if any: what
        verification nearly always gets too (`VerifyCheckout.expected`)."""
        ready = self._ready
        if ready is None or ready.outputs is None:
            return None
        return ready.outputs, ready.sealed

    def enter(self, ws: TaskWorkspace) -> None:
        """The phase itself: ready, and the setup's files (node_modules, .venv...) in the
        worktree before the worker starts (what the worktree already holds wins)."""
        self.handle.enter_phase("environment")
        ready = self.ready()
        if ready is not None and (outputs := ready.outputs) is not None:
            owner = self.handle.ctx.sandbox_identity()[1]
            home = self.handle.ctx.home
            if ws.upper is not None:  # layered: the files linked once, put under in one step
                try:
                    view: Path | None = view_tree(home, outputs, owner, ready.sealed)
                except OSError:  # a sealed view gone or unmountable since it was picked
                    view = None
                if view is not None and layer_under(ws, view, owner):
                    data = {"files": "layered", "sealed": ready.sealed is not None}
                    self.handle.emit("environment.outputs", data)
                    return
            if ready.sealed is not None:  # not layered after all: the entry's files, checked
                ready = self._ready = unsealed(ready)
            add_cached_files(self.handle, outputs, None, ws.worktree)

    def for_verification(
        self,
        snapshot: str,
        changes: list[Change] | None,
        trusted: str | None = None,
        *,
        full: int,
    ) -> tuple[Ready | None, EnvironmentDoc | None]:
        """The environment to verify ``snapshot`` in, and what the result says of it
        (``changes``: base -> snapshot, None when not known; ``trusted``: a commit of the
        user's whose dependency files may be set up as theirs; ``full``: how many full
        checkouts will get the cached files, one by one).
        A change inside what the setup makes (a tracked file under node_modules) is refused:
        dependencies come from setup, never from the change."""
        ready = self.ready()
        if ready is None:
            return None, None
        if full and ready.sealed is not None:  # linked, not copied: checked whole
            ready = unsealed(ready)
        # The cached files the worker was given are checked by now (or set up again).
        ready = self._ready = confirmed(self.handle, ready)
        for change in changes or ():
            for path in change.paths:
                made = next((p for p in ready.paths if path == p or path.startswith(p + "/")), None)
                if made is not None:
                    shown = self.handle.redactor.redact(display(path))
                    raise BridgeError(
                        f"The change adds {shown}, inside {display(made)}, which the "
                        "environment's setup makes; dependencies come from setup: change the "
                        "manifest instead, and leave the setup's files out of the change.",
                        kind="protected_path",
                    )
        ready, changed = for_snapshot(self.handle, ready, snapshot, trusted, changes)
        ready = confirmed(self.handle, ready)
        document = ready.document(changed)
        if changed:
            document.setup = "ran_for_snapshot"
        return ready, document

    def discard(self) -> None:
        """Remove the task's private setups (for its snapshots): their files and images."""
        root = self.handle.ctx.task_dir(self.handle.task_id) / "environments"
        if not root.is_dir():
            return
        for item in entries_in(root):
            image = item.image if isinstance(item, Entry) else None
            folder = item.folder if isinstance(item, Entry) else item
            remove_entry(folder, image, self.handle.ctx.sandbox.remove_image)
        remove_tree(root)


# -- at creation, and before a verb that runs more of a task ------------------------------


def check_environment(
    config: Config, sandbox: Sandbox, spec: TaskSpec, git: Git, base_commit: str, worker: Worker
) -> None:
    """At creation: the images the spec names are allowed, the environment's definition (and
    devcontainer.json) reads, its worker can run in one, and a named image is in the engine
    (InvalidSpec naming what is not)."""
    definition = check_images(config, config, spec, git, base_commit)
    if definition is None:
        return
    if worker.probe is None:
        raise InvalidSpec(
            f"The {worker.name} worker cannot run inside a project environment; drop "
            "`environment` or choose a built-in worker."
        )
    if definition.image and not sandbox.image_present(definition.image):
        raise InvalidSpec(
            f"Environment image {definition.image} is not present in this engine; build "
            "it, or `docker load` it from a saved file (worker-bridge never pulls images)."
        )


def check_images(
    allowing: Config, running: Config, spec: TaskSpec, git: Git, base_commit: str
) -> EnvDefinition | None:
    """The images the spec names are allowed by ``allowing``'s patterns (InvalidSpec naming
    the first that is not): its verification image, and those of its environment as it runs
    with ``running`` (its definition, returned: read and checked on the way) at
    ``base_commit``. At creation both are the configuration the task is made with; before a
    verb that runs more of it, ``allowing`` is the owner's configuration now."""
    if spec.verification.image:
        check_image(allowing, spec.verification.image, "verification.image")
    definition = resolve_definition(running, spec, git, base_commit)
    if definition is None:
        return None
    if definition.image and (spec.environment is not None or definition.devcontainer):
        # Named by the caller (or by the devcontainer.json at the ref the caller chose); a
        # configured default is the owner's own choice. Checked before the engine is asked, so
        # a refusal says nothing of what the engine holds.
        where = (
            f"{definition.devcontainer}'s image" if definition.devcontainer else "environment.image"
        )
        check_image(allowing, definition.image, where)
    if definition.build is not None:  # the Dockerfile is the repository's: the caller's choice
        check_build_images(allowing, git, base_commit, definition.build)
    return definition


def check_build_images(
    config: Config, git: Git, base_commit: str, build: DevcontainerBuild
) -> None:
    """Every image a devcontainer's Dockerfile builds from is allowed (InvalidSpec naming the
    first that is not)."""
    text = read_blob(git, base_commit, build.dockerfile)
    if text is None:
        return  # resolve_definition refused it already
    where = f"{build.dockerfile} (the devcontainer's build)"
    for ref in dockerfile_images(text.decode("utf-8", "replace"), dict(build.args), where):
        check_image(config, ref, f"{build.dockerfile}'s base image")
