"""Running a setup: its commands, each in a container of its own, on a clean checkout of the
commit it is for, never during the worker's run or verification.

A setup of the user's definition at a base commit runs as root inside its containers when the
bridge runs as root (nothing is granted: no capabilities, no new privileges) on a writable copy
of the environment image, each command's result committed for the next. A setup of the worker's
snapshot (`SetupPlan.worker_files`) runs the worker's code: as the sandbox user, on the base's
read-only image, committing nothing. Either way its only network is its gateway, whose proxy
reaches only the plan's names and which holds no model route and no credential; what it writes
is held to `limits.disk_mb` (the repository's folder while it runs, the container's own layer
when it ends). Output streams into `environment.output` events; a failing command ends the task
with `error.kind = environment` and the end of its output.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Literal

from bridge.environments.bundle import BUNDLE
from bridge.environments.cache import Entry
from bridge.environments.definition import EnvDefinition
from bridge.environments.log import OutputEvents
from bridge.environments.outputs import keep_outputs
from bridge.environments.ready import Ready, SetupPlan
from bridge.errors import BridgeError, EnvironmentFailed
from bridge.phase.handle import PhaseHandle
from bridge.phase.network import open_gateway, with_gateway
from bridge.phase.run_container import Reader, run_container
from bridge.phase.specs import task_container
from bridge.phase.watch import DiskWatch
from bridge.sandbox import LABEL, ContainerSpec, ExitInfo, Mount, home_id
from bridge.sandbox.output import Tail
from bridge.workspace.diff import export_snapshot
from bridge.workspace.fs import remove_tree
from bridge.workspace.worktree import chown_tree

TAIL_CHARS = 1500  # of a failing command's output, in the task's error


class SetupTimedOut(BridgeError):
    """The task's own deadline passed while setup ran (the runner ends it `timed_out`)."""

    kind = "timeout"


def run_setup(handle: PhaseHandle, ready: Ready, plan: SetupPlan) -> Entry:
    """Run the setup's commands for ``plan`` from ``ready``'s image; the entry made."""
    ctx, definition = handle.ctx, ready.definition
    handle.emit(
        "environment.setup",
        {
            "status": "started",
            "key": plan.key,
            "image": ready.image,
            "commit": plan.commit,
            "commands": list(definition.setup),
            "reason": plan.reason,
            "network": list(plan.network),
            "for": "snapshot" if plan.worker_files else "base",
        },
    )
    # A dead runner's setup containers (this phase is never adopted: it starts again).
    ctx.sandbox.remove_by_labels({f"{LABEL}.task": handle.task_id, f"{LABEL}.role": "setup"})
    scratch = ctx.task_dir(handle.task_id) / f"setup-{plan.key[:12]}"
    partial = plan.folder.with_name(f".partial-{plan.key}-{os.getpid()}-{os.urandom(3).hex()}")
    remove_tree(scratch)
    scratch.mkdir(parents=True)
    plan.folder.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        checkout = scratch / "checkout"
        export_snapshot(ctx.home, Path(handle.record.repository), plan.commit, checkout, scratch)
        sandbox_owner = ctx.sandbox_identity()[1]
        if plan.worker_files and sandbox_owner is not None:
            chown_tree(checkout, *sandbox_owner)  # the sandbox user writes it
        allowlist = list(plan.network) or None
        name = f"{handle.task_id}-setup"
        # The sockets belong to the setup's user: root or the bridge's own (owner None), or
        # the sandbox identity for the worker's files.
        owner: Literal[True] | None = True if plan.worker_files else None
        gateway_cm = (
            open_gateway(handle, [], allowlist, name, owner=owner, setup=True)
            if allowlist
            else nullcontext()
        )
        with gateway_cm as gateway:
            _commands(handle, ready, plan, checkout, gateway, t0 + definition.setup_timeout_s)
        entry = keep_outputs(handle, checkout, partial, plan, definition)
        handle.emit(
            "environment.setup",
            {
                "status": "completed",
                "key": plan.key,
                "image": entry.image,
                "duration_s": round(time.monotonic() - t0, 3),
                "files": entry.record["files"],
                "bytes": entry.record["bytes"],
            },
        )
        handle.timings["setup_s"] = round(
            handle.timings.get("setup_s", 0.0) + time.monotonic() - t0, 3
        )
        return entry
    except BaseException:
        if not plan.worker_files:  # the image it runs in is the base's: not the setup's own
            try:
                ctx.sandbox.remove_image(plan.tag)  # a half-made result is never kept
            except BridgeError:
                pass
        remove_tree(partial)
        raise
    finally:
        remove_tree(scratch)


def _commands(
    handle: PhaseHandle, ready: Ready, plan: SetupPlan, checkout: Path, gateway, deadline: float
) -> None:  # noqa: ANN001
    ctx, definition = handle.ctx, ready.definition
    current = ready.image
    output = OutputEvents(handle)
    limit = handle.limits.disk_mb * 2**20
    for index, command in enumerate(definition.setup):
        left = deadline - time.monotonic()
        if left <= 0:
            raise _setup_timeout(handle, definition, command)
        spec = _setup_spec(handle, definition, current, ready.bundle, checkout, command, index)
        if plan.worker_files:
            user, _ = ctx.sandbox_identity()
            spec = replace(spec, user=user, read_only_root=True, env={"HOME": "/tmp", **spec.env})
        spec = _in_command(
            with_gateway(spec, handle, gateway, no_proxy=False), definition.container_env
        )
        tail = Tail(TAIL_CHARS * 4)
        output.command = command
        started: list[str] = []
        written: list[int | None] = []

        def consume(chunks: Iterator[bytes], tail: Tail = tail) -> None:
            output.consume(chunks, tail)

        def on_start(cid: str, _adopted: bool, started: list[str] = started) -> None:
            started.append(cid)

        def on_exit(
            info: ExitInfo, started: list[str] = started, written: list[int | None] = written
        ) -> None:
            if not started:
                return
            written.append(ctx.sandbox.written_bytes(started[0]))
            fine = info.exit_code == 0 and not info.timed_out and (written[0] or 0) <= limit
            if fine and not plan.worker_files:
                ctx.sandbox.commit(started[0], plan.tag, _labels(handle, plan.key))

        watch = DiskWatch(handle)
        run = run_container(
            handle,
            spec,
            readers=[Reader(consume)],
            on_start=on_start,
            on_exit=on_exit,
            watchdog=watch,
            timeout=left,
        )
        handle.ensure_active()
        info = run.exit
        handle.emit(
            "environment.setup",
            {
                "status": "command",
                "command": command,
                "exit_code": info.exit_code,
                "duration_s": info.duration_s,
            },
        )
        over = watch.message(f"Setup command `{command}`")
        if over is None and written and (written[0] or 0) > limit:
            over = (
                f"Setup command `{command}` wrote {(written[0] or 0) // 2**20} MB outside the "
                f"repository, past limits.disk_mb ({handle.limits.disk_mb} MB); raise the limit "
                "or install less."
            )
        if over is not None:
            raise EnvironmentFailed(over, kind="disk")
        if info.timed_out:
            raise _setup_timeout(handle, definition, command)
        if info.exit_code != 0:
            said = handle.redactor.redact(tail.text()).strip()[-TAIL_CHARS:]
            what = (
                "was killed: out of memory (limits.memory_mb)"
                if info.oom_killed
                else f"exited with status {info.exit_code}"
            )
            whose = "The setup of the worker's snapshot: setup" if plan.worker_files else "Setup"
            raise EnvironmentFailed(
                f"{whose} command `{command}` {what}; the end of its output:\n"
                f"{said or '(no output)'}"
            )
        if not plan.worker_files:
            current = plan.tag


def _in_command(spec: ContainerSpec, keep: dict[str, str]) -> ContainerSpec:
    """``spec`` with every variable but ``keep`` set by `env` in its command instead: the
    committed image must not take the container's own (its proxy, its CA file mount)."""
    extra = [f"{k}={v}" for k, v in spec.env.items() if k not in keep]
    if not extra:
        return spec
    return replace(spec, env=dict(keep), command=["env", *extra, *spec.command])


def _setup_timeout(handle: PhaseHandle, definition: EnvDefinition, command: str) -> BridgeError:
    if handle.remaining() <= 1:
        return SetupTimedOut(f"The task's deadline passed while setup ran `{command}`.")
    return EnvironmentFailed(
        f"Setup did not finish within {definition.setup_timeout_s} s (`{command}` was "
        "running); raise environment.setup_timeout_seconds (or config setup_timeout_s), or "
        "make the setup faster."
    )


def _labels(handle: PhaseHandle, key: str) -> dict[str, str]:
    return {
        f"{LABEL}.home": home_id(handle.ctx.home),
        f"{LABEL}.role": "environment",
        f"{LABEL}.env-key": key,
    }


def _setup_spec(
    handle: PhaseHandle,
    definition: EnvDefinition,
    image: str,
    bundle: Path,
    checkout: Path,
    command: str,
    index: int,
) -> ContainerSpec:
    # Root inside the container only when the bridge is root (files it makes are then the
    # host's root's, which the sandbox user cannot change); otherwise the bridge's own user.
    user = "0:0" if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"
    mounts = [Mount(checkout, "/workspace", read_only=False), Mount(bundle, BUNDLE)]
    env = dict(definition.container_env)
    if os.geteuid() != 0:  # an unnamed uid in the image: its HOME would be `/`, unwritable
        env.setdefault("HOME", "/tmp")
    return task_container(
        handle,
        "setup",
        image,
        ["sh", "-c", command],
        user=user,
        mounts=mounts,
        env=env,
        own_image=True,
        labels={"command": str(index)},
        read_only_root=False,  # committed afterwards: the setup's result
        extra_ca=True,
    )
