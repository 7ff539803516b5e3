"""The one builder of a task container's spec: what every container of a task gets alike (the
task's memory, CPU, process and engine-log limits, the configured runtime, the labels that tie
it to its task, role and state root), so the worker, each verification command, each setup
command and the bundle's probe differ only in what is theirs (image, command, user, mounts,
environment); a container that fetches from the network gets the configured extra CA file."""

from __future__ import annotations

from bridge.phase.handle import PhaseHandle
from bridge.sandbox import ContainerSpec, Mount

EXTRA_CA = "/etc/worker-bridge/extra-ca.pem"  # where a container finds the extra CA file


def task_container(
    handle: PhaseHandle,
    role: str,
    image: str,
    command: list[str],
    *,
    user: str,
    mounts: list[Mount],
    env: dict[str, str],
    own_image: bool = False,
    labels: dict[str, str] | None = None,
    tmpfs: tuple[str, ...] = ("/tmp",),
    read_only_root: bool = True,
    extra_ca: bool = False,
) -> ContainerSpec:
    """A container of ``role`` (worker, verify, setup, probe) for the task. ``own_image``: a
    project's own image, whose entrypoint is not ours to run. ``extra_ca``: the configured
    extra CA file mounted (and named to Node.js), for a container that talks to the network."""
    ctx, limits = handle.ctx, handle.limits
    if extra_ca and ctx.config.extra_ca_file:
        mounts = [*mounts, Mount(ctx.config.extra_ca_file, EXTRA_CA)]
        env = {**env, "NODE_EXTRA_CA_CERTS": EXTRA_CA}
    return ContainerSpec(
        image=image,
        command=command,
        user=user,
        labels=ctx.labels(handle.task_id, role, **(labels or {})),
        mounts=mounts,
        env=env,
        entrypoint=[] if own_image else None,
        memory_mb=limits.memory_mb,
        cpus=limits.cpus,
        pids=limits.pids,
        runtime=ctx.config.runtime,
        log_max_mb=limits.log_mb,
        tmpfs=tmpfs,
        read_only_root=read_only_root,
    )
