"""The environment's image: the user's own (it must be in the engine: images are never pulled),
or one built from the devcontainer's Dockerfile and context at the task's base commit (a clean
checkout of it, never the worker's files), tagged by what it was built from so a later task with
the same Dockerfile and context reuses it. The build runs as `docker build` would for the user,
on the engine's build network: the Dockerfile is the repository's own at the base commit."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from pathlib import Path

from bridge.environments.definition import EnvDefinition
from bridge.environments.log import OutputEvents
from bridge.errors import BridgeError, EnvironmentFailed
from bridge.phase.handle import PhaseHandle
from bridge.sandbox import LABEL, home_id
from bridge.workspace.diff import export_snapshot
from bridge.workspace.fs import remove_tree
from bridge.workspace.git import Git


def environment_image(
    handle: PhaseHandle, definition: EnvDefinition
) -> tuple[str, dict[str, str], str]:
    """(ref, environment variables, id) of the environment's image, built first from the
    devcontainer's Dockerfile when it has one and the build is not in the engine yet."""
    sandbox = handle.ctx.sandbox
    ref = env_image_ref(handle, definition)
    info = sandbox.known_image(ref)  # the permission check looked it up a moment ago
    if info is None and definition.build is not None:
        _build(handle, definition, ref)
        info = sandbox.inspect_image(ref)
    if info is None:
        raise EnvironmentFailed(
            f"Image {ref} is not present in this engine; build it, or `docker load` it from "
            "a saved file (worker-bridge never pulls images)."
        )
    return ref, info.env, info.id


def env_image_ref(handle: PhaseHandle, definition: EnvDefinition) -> str:
    if definition.build is None:
        assert definition.image is not None
        return definition.image
    build = definition.build
    git = Git(Path(handle.record.repository))
    base = handle.record.base_commit or ""
    where = f"{base}:{build.context}" if build.context != "." else f"{base}^{{tree}}"
    context_tree = git.out("rev-parse", where)
    document = {
        "context": context_tree,
        "dockerfile": build.dockerfile,
        "args": build.args,
        "target": build.target,
    }
    digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
    return f"worker-bridge-env-build:{digest[:32]}-{home_id(handle.ctx.home)}"


def _build(handle: PhaseHandle, definition: EnvDefinition, tag: str) -> None:
    """Build the devcontainer's Dockerfile from its context at the base commit (a clean
    checkout of it, never the worker's files)."""
    build = definition.build
    assert build is not None
    ctx = handle.ctx
    scratch = ctx.task_dir(handle.task_id) / "env-build"
    remove_tree(scratch)
    scratch.mkdir(parents=True)
    handle.emit("environment.build", {"dockerfile": build.dockerfile, "image": tag})
    t0 = time.monotonic()
    try:
        checkout = scratch / "context"
        export_snapshot(
            ctx.home,
            Path(handle.record.repository),
            handle.record.base_commit or "",
            checkout,
            scratch,
        )
        context_dir = checkout / build.context if build.context != "." else checkout
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as archive:
            archive.add(context_dir, arcname=".", recursive=True)
        dockerfile = os.path.relpath(checkout / build.dockerfile, context_dir)
        output = OutputEvents(handle)
        output.command = f"build {build.dockerfile}"
        limit = min(definition.setup_timeout_s, max(handle.remaining(), 1.0))
        deadline = time.monotonic() + limit

        def line(text: str) -> None:
            # Each line of output is a chance to stop: a cancel, or the deadline (leaving the
            # stream closes the build's connection, and the engine stops the build).
            handle.ensure_active()
            if time.monotonic() > deadline:
                raise EnvironmentFailed(
                    f"{definition.devcontainer}'s Dockerfile did not build within {limit:.0f} s; "
                    "raise environment.setup_timeout_seconds, or make the build faster."
                )
            output.line(text)

        try:
            ctx.sandbox.build_image(
                tag,
                data.getvalue(),
                buildargs=dict(build.args),
                labels={f"{LABEL}.home": home_id(ctx.home), f"{LABEL}.role": "environment"},
                on_line=line,
                dockerfile=dockerfile,
                target=build.target,
                timeout=limit,  # a step silent past the deadline ends the build too
            )
        except EnvironmentFailed:
            raise
        except BridgeError as exc:
            raise EnvironmentFailed(
                f"{definition.devcontainer}'s Dockerfile did not build: {exc.message}"
            ) from exc
    finally:
        remove_tree(scratch)
    handle.emit("environment.built", {"image": tag, "duration_s": round(time.monotonic() - t0, 3)})
