"""Whether a configured container runtime can run tasks here. gVisor (runsc) must be allowed to
open host Unix sockets (the gateway's is bind-mounted into the worker's container) and must not
set up a network of its own (the sandbox has only `lo`); a task never runs with less isolation
than configured: preflight refuses instead."""

from __future__ import annotations

GVISOR_ARGS = ("--host-uds=open", "--network=none")


def runtime_check(runtime: str, registered: dict[str, list[str]]) -> tuple[bool, str]:
    """Whether the configured runtime can run tasks here, with the one line that says so.
    gVisor must be allowed to open host Unix sockets (the gateway's) and needs no network of
    its own; without those a task would fail, never run with less isolation."""
    if runtime not in registered:
        return False, (
            f'runtime {runtime} is not registered with the engine; add it to the "runtimes" '
            "of /etc/docker/daemon.json (and, for runsc, the runtimeArgs "
            f"{list(GVISOR_ARGS)}), then reload dockerd."
        )
    args = registered[runtime]
    if "runsc" in runtime or any("runsc" in a for a in args):
        missing = [a for a in GVISOR_ARGS if not _has_flag(args, a)]
        if missing:
            return False, (
                f"runtime {runtime} (gVisor) lacks the runtimeArgs {missing} in "
                "/etc/docker/daemon.json: the gateway's Unix socket needs host UDS opening, "
                "and the sandbox needs no network of gVisor's own; add them and reload dockerd."
            )
    return True, f"runtime {runtime} registered ({' '.join(args) or 'no extra arguments'})"


def _has_flag(args: list[str], wanted: str) -> bool:
    name, _, value = wanted.partition("=")
    for arg in args:
        a_name, _, a_value = arg.lstrip("-").partition("=")
        if a_name == name.lstrip("-") and (
            a_value == value or (name.endswith("uds") and a_value == "all")
        ):
            return True
    return False
