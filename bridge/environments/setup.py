"""Making a task's environment ready: its image (the user's, or built from the devcontainer's
Dockerfile), the worker's bundle and probe, and the setup's result from the cache or from a
setup run.

Setup runs in a phase and containers of its own, on a clean checkout of the commit it is for,
never during the worker's run or verification. Each command is one container of the environment
image (the last one's result, for the next), as root inside it when the bridge runs as root
(nothing is granted: no capabilities, no new privileges), with no network but its gateway,
whose proxy reaches only `setup_network` and which holds no model route and no credential. After
each command the container's root filesystem is committed; after the last, the ignored files it
made in the checkout are moved into the cache entry. Output streams into `environment.output`
events; a failing command ends the task with `error.kind = environment` and its output's end.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from bridge.environments.bundle import BUNDLE, check_worker_runs, image_path, worker_bundle
from bridge.environments.cache import (
    Entry,
    cache_root,
    check_entry,
    image_tag,
    key_lock,
    load_entry,
    remove_entry,
    setup_key,
    sweep_partials,
)
from bridge.environments.definition import (
    EnvDefinition,
    key_files,
    resolve_definition,
    tree_files,
)
from bridge.environments.image import env_image_ref, environment_image
from bridge.environments.log import OutputEvents
from bridge.environments.outputs import keep_outputs
from bridge.errors import BridgeError, EnvironmentFailed, InvalidSpec
from bridge.pipeline.containers import Reader, run_container
from bridge.pipeline.handle import PhaseHandle
from bridge.pipeline.network import open_gateway, with_gateway
from bridge.pipeline.watch import DiskWatch
from bridge.sandbox import LABEL, ContainerSpec, Mount, home_id
from bridge.sandbox.output import Tail
from bridge.workers import Worker
from bridge.workspace.changes import export_snapshot
from bridge.workspace.fs import remove_tree
from bridge.workspace.git import Git
from bridge.workspace.rawgit import raw_git

TAIL_CHARS = 1500  # of a failing command's output, in the task's error


class SetupTimedOut(BridgeError):
    """The task's own deadline passed while setup ran (the runner ends it `timed_out`)."""

    kind = "timeout"


@dataclass
class Ready:
    """An environment made ready: what the worker and the verifier run in."""

    definition: EnvDefinition
    image: str  # the image containers start from (the setup's result, or the environment's)
    image_env: dict[str, str]  # the environment image's own variables (its PATH)
    bundle: Path  # the worker's bundle, mounted at /opt/worker-bridge
    key: str | None  # the setup's cache key (None: no setup)
    files: dict[str, str]  # the dependency files that keyed it (path -> blob)
    outputs: Path | None  # cached ignored files to put into the repository's folder
    setup: str  # none | cached | ran

    @property
    def worker_env(self) -> dict[str, str]:
        """Variables of the worker's container: the environment's, the bundle first on PATH."""
        return {**self.definition.container_env, "PATH": image_path(self.image_env)}

    @property
    def verify_env(self) -> dict[str, str]:
        """Variables of a verification container (the image's own PATH: no CLI on it)."""
        return dict(self.definition.container_env)

    def document(self) -> dict:
        return {
            "source": self.definition.source,
            "image": self.image,
            "key": self.key,
            "setup": self.setup,
        }


def definition_for(handle: PhaseHandle) -> EnvDefinition | None:
    record = handle.record
    try:
        return resolve_definition(
            handle.ctx.config, record.spec, Path(record.repository), record.base_commit or ""
        )
    except InvalidSpec as exc:
        raise EnvironmentFailed(exc.message) from exc


def prepare_environment(handle: PhaseHandle, worker: Worker, definition: EnvDefinition) -> Ready:
    """The environment for the task's base commit (the shared cache, or a setup run)."""
    image, info_env, image_id = environment_image(handle, definition)
    bundle = worker_bundle(handle, worker.image(handle.ctx.config))
    check_worker_runs(handle, worker, image, image_id, info_env, bundle)
    return _with_setup(
        handle, definition, image, image_id, info_env, bundle, handle.record.base_commit or ""
    )


def for_snapshot(handle: PhaseHandle, base: Ready, snapshot: str) -> tuple[Ready, list[str]]:
    """The environment verification of ``snapshot`` needs: the base's when the snapshot's
    dependency files are the base's, else a setup run for the snapshot (task-private: what
    the worker's files make is never shared with another task). Also the changed files."""
    if base.key is None:
        return base, []
    files = key_files(base.definition, tree_files(_git(handle), snapshot))
    if files == base.files:
        return base, []
    changed = sorted(p for p in set(files) | set(base.files) if files.get(p) != base.files.get(p))
    image_info = handle.ctx.sandbox.inspect_image(env_image_ref(handle, base.definition))
    if image_info is None:
        raise EnvironmentFailed("The environment's image went away during the task; run it again.")
    ready = _with_setup(
        handle,
        base.definition,
        env_image_ref(handle, base.definition),
        image_info.id,
        image_info.env,
        base.bundle,
        snapshot,
        private=True,
        reason=f"the worker changed {', '.join(changed[:5])}",
    )
    return ready, changed


# -- setup and the cache --------------------------------------------------------------------


def _with_setup(
    handle: PhaseHandle,
    definition: EnvDefinition,
    image: str,
    image_id: str,
    image_env: dict[str, str],
    bundle: Path,
    commit: str,
    *,
    private: bool = False,
    reason: str = "no cache entry",
) -> Ready:
    ready = Ready(definition, image, image_env, bundle, None, {}, None, "none")
    if not definition.setup:
        return ready
    files = key_files(definition, tree_files(_git(handle), commit))
    key = setup_key(
        image_id, definition.setup, definition.container_env, definition.setup_network, files
    )
    ready.key, ready.files = key, files
    ctx = handle.ctx
    if private:
        root = ctx.task_dir(handle.task_id) / "environments"
        tag = image_tag(ctx.home, key, handle.task_id)
    else:
        root = cache_root(ctx.home)
        tag = image_tag(ctx.home, key)
    folder = root / key

    def waiting() -> None:
        handle.ensure_active()
        if handle.remaining() <= 0:
            raise SetupTimedOut("The task's deadline passed while it waited for a setup.")

    root.mkdir(parents=True, exist_ok=True)
    # One setup per key at a time across processes; a task's private entry is its own.
    lock = nullcontext() if private else key_lock(ctx.home, key, wait=waiting)
    with lock:
        entry = load_entry(folder)
        why = "its record is unreadable" if folder.exists() and entry is None else None
        if entry is not None:
            why = check_entry(entry, _image_id_of(handle))
            if why is None:
                entry.touch()
                handle.emit(
                    "environment.cached",
                    {"key": key, "image": entry.image, "files": entry.record.get("files")},
                )
                ready.image, ready.outputs, ready.setup = entry.image, entry.outputs, "cached"
                return ready
        if why is not None:
            handle.emit("environment.cache_corrupt", {"key": key, "reason": why})
            remove_entry(folder, entry.image if entry else tag, ctx.sandbox.remove_image)
            reason = f"the cache entry could not be trusted ({why})"
        if not private:
            sweep_partials(ctx.home)
        entry = _run_setup(handle, ready, commit, folder, tag, reason)
    ready.image, ready.outputs, ready.setup = entry.image, entry.outputs, "ran"
    return ready


def _image_id_of(handle: PhaseHandle):  # noqa: ANN202
    def find(ref: str) -> str | None:
        info = handle.ctx.sandbox.inspect_image(ref)
        return info.id if info else None

    return find


def _run_setup(
    handle: PhaseHandle, ready: Ready, commit: str, folder: Path, tag: str, reason: str
) -> Entry:
    """Run the setup's commands on a clean checkout of ``commit`` in ``ready``'s image, and
    keep the result as the entry in ``folder`` (image ``tag``)."""
    ctx = handle.ctx
    definition, image, bundle = ready.definition, ready.image, ready.bundle
    key, files = ready.key or "", ready.files
    commands = definition.setup
    handle.emit(
        "environment.setup",
        {
            "status": "started",
            "key": key,
            "image": image,
            "commit": commit,
            "commands": list(commands),
            "reason": reason,
            "network": list(definition.setup_network),
        },
    )
    # A dead runner's setup containers (this phase is never adopted: it starts again).
    ctx.sandbox.remove_by_labels({f"{LABEL}.task": handle.task_id, f"{LABEL}.role": "setup"})
    scratch = ctx.task_dir(handle.task_id) / f"setup-{key[:12]}"
    partial = folder.with_name(f".partial-{key}-{os.getpid()}-{os.urandom(3).hex()}")
    remove_tree(scratch)
    scratch.mkdir(parents=True)
    t0 = time.monotonic()
    deadline = t0 + definition.setup_timeout_s
    try:
        checkout = scratch / "checkout"
        export_snapshot(ctx.home, Path(handle.record.repository), commit, checkout, scratch)
        current = image
        output = OutputEvents(handle)
        allowlist = list(definition.setup_network) or None
        name = f"{handle.task_id}-setup"
        # The setup's user (root, or the bridge's own: see _setup_spec) owns the sockets.
        gateway_cm = (
            open_gateway(handle, [], allowlist, name, owner=None) if allowlist else nullcontext()
        )
        with gateway_cm as gateway:
            for index, command in enumerate(commands):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _setup_timeout(handle, definition, command)
                spec = _setup_spec(handle, definition, current, bundle, checkout, command, index)
                spec = _in_command(
                    with_gateway(spec, handle, gateway, no_proxy=False), definition.container_env
                )
                tail = Tail(TAIL_CHARS * 4)
                output.command = command
                started: list[str] = []
                kept: list[str] = []

                def on_exit(info, started=started, kept=kept):  # noqa: ANN001, ANN202
                    if info.exit_code == 0 and not info.timed_out and started:
                        kept.append(ctx.sandbox.commit(started[0], tag, _labels(handle, key)))

                watch = DiskWatch(handle)
                run = run_container(
                    handle,
                    spec,
                    readers=[Reader(lambda chunks, tail=tail: output.consume(chunks, tail))],
                    on_start=lambda cid, _adopted, started=started: started.append(cid),
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
                    raise EnvironmentFailed(
                        f"Setup command `{command}` {what}; the end of its output:\n"
                        f"{said or '(no output)'}"
                    )
                current = tag
        entry = keep_outputs(handle, checkout, commit, partial, folder, tag, key, files, definition)
        handle.emit(
            "environment.setup",
            {
                "status": "completed",
                "key": key,
                "image": tag,
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
        try:
            ctx.sandbox.remove_image(tag)  # a half-made result is never kept
        except BridgeError:
            pass
        remove_tree(partial)
        raise
    finally:
        remove_tree(scratch)


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
    ctx, limits = handle.ctx, handle.limits
    # Root inside the container only when the bridge is root (files it makes are then the
    # host's root's, which the sandbox user cannot change); otherwise the bridge's own user.
    user = "0:0" if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"
    mounts = [Mount(checkout, "/workspace", read_only=False), Mount(bundle, BUNDLE)]
    env = dict(definition.container_env)
    if os.geteuid() != 0:  # an unnamed uid in the image: its HOME would be `/`, unwritable
        env.setdefault("HOME", "/tmp")
    if ctx.config.extra_ca_file:
        mounts.append(Mount(ctx.config.extra_ca_file, "/etc/worker-bridge/extra-ca.pem"))
        env["NODE_EXTRA_CA_CERTS"] = "/etc/worker-bridge/extra-ca.pem"
    return ContainerSpec(
        image=image,
        command=["sh", "-c", command],
        user=user,
        labels=ctx.labels(handle.task_id, "setup", command=str(index)),
        mounts=mounts,
        env=env,
        memory_mb=limits.memory_mb,
        cpus=limits.cpus,
        pids=limits.pids,
        runtime=ctx.config.runtime,
        log_max_mb=limits.log_mb,
        tmpfs=("/tmp",),
        entrypoint=[],
        read_only_root=False,
    )


def _git(handle: PhaseHandle) -> Git:
    """Git on the attribute-free git dir: the repository's objects, and the trees accept
    merges there (a re-verification's tree exists only in it)."""
    return raw_git(handle.ctx.home, Path(handle.record.repository))
