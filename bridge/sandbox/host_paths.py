"""The same-path check for a bridge that runs in its own container.

Task containers bind-mount host paths (worktrees, task folders, object packs, gateway sockets,
all under the state root) that the bridge names by its own paths, and the engine resolves a
bind mount's source on its host, not in the bridge's container. So when the bridge runs in a
container, the state root and every repository must be bind mounts whose host source equals
their path inside. This module asks the engine for the bridge's own container's mounts and says,
in one sentence, which path differs and how to mount it.

The check is on only where the bridge's image says it runs in a container
(`WORKER_BRIDGE_IN_CONTAINER=1`, set in the top-level Dockerfile): `/.dockerenv` and cgroups also
show up on hosts that are themselves containers or VMs where paths do match. Set it to 0 to skip
the check where the engine cannot see the bridge's container but the paths are known to match.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from bridge.errors import BridgeError, ConfigError, InvalidSpec
from bridge.models import JsonObject

IN_CONTAINER_ENV = "WORKER_BRIDGE_IN_CONTAINER"
HOME_ENV = "WORKER_BRIDGE_HOME"
# Where compose/compose.yaml mounts the repositories (os.pathsep-separated); doctor checks each.
REPOS_ENV = "WORKER_BRIDGE_REPOS"

_CONTAINER_ID = re.compile(r"(?:/containers/|/docker/|docker-)([0-9a-f]{64})")
_mounts: list[JsonObject] | None = None  # our container's mounts: fixed while it runs


def in_container(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(IN_CONTAINER_ENV, "").strip() not in ("", "0")


def container_id(mountinfo: str, cgroup: str, hostname: str) -> str:
    """Our container's id as the engine knows it: the engine's per-container files bind-mounted
    at /etc/hostname etc. name it in mountinfo; cgroup v1 paths name it too; the hostname is the
    short id unless the container was given another one."""
    for text in (mountinfo, cgroup):
        found = _CONTAINER_ID.search(text)
        if found:
            return found.group(1)
    return hostname


def mount_problem(
    path: Path | str, mounts: list[JsonObject], what: str, setting: str | None = None
) -> str | None:
    """None when ``path`` lies in a bind mount whose host source is its destination; otherwise
    one sentence naming the path, where it comes from and the mount that fixes it.
    ``mounts`` is the engine's `Mounts` list for the container; ``what`` names the path
    ("The state root"), ``setting`` the variable that names it (WORKER_BRIDGE_HOME)."""
    target = PurePosixPath(os.path.normpath(str(path)))
    best: JsonObject | None = None
    for mount in mounts:
        dest = PurePosixPath(os.path.normpath(mount.get("Destination") or "/"))
        if target == dest or dest in target.parents:
            if best is None or len(dest.parts) > len(PurePosixPath(best["Destination"]).parts):
                best = mount
    same = f"-v {target}:{target}"
    if best is None:
        return (
            f"{what} {target} is inside the bridge's container, not mounted from the host; "
            f"mount a host folder at the same path: {same}."
        )
    if best.get("Type") != "bind":
        kind = f"the volume {best['Name']}" if best.get("Name") else f"a {best.get('Type')} mount"
        return (
            f"{what} {target} is on {kind}, which task containers cannot mount by that path; "
            f"mount a host folder at the same path instead: {same}."
        )
    dest = PurePosixPath(os.path.normpath(best["Destination"]))
    source = PurePosixPath(os.path.normpath(best["Source"]))
    if source == dest:
        return None
    host = source / target.relative_to(dest)
    hint = f"{setting}={host}" if setting else f"name it by its host path {host}"
    return (
        f"{what} {target} is mounted from {host} on the host; mount it at the same path: "
        f"-v {source}:{source} and {hint}."
    )


def own_mounts() -> list[JsonObject]:
    """The `Mounts` of the container this process runs in, from the engine (once per process).
    Raises BridgeError with one sentence when the engine or the container cannot be found."""
    global _mounts
    if _mounts is not None:
        return _mounts
    from bridge.sandbox.docker import DockerSandbox

    ident = container_id(_read("/proc/self/mountinfo"), _read("/proc/self/cgroup"), _hostname())
    try:
        found = DockerSandbox().container_mounts(ident)
    except BridgeError as exc:  # the engine unreachable, or refusing
        raise _engine_error(exc) from exc
    if found is None:
        raise ConfigError(
            f"The bridge runs in a container ({IN_CONTAINER_ENV}=1) that the engine behind its "
            f"socket does not know (looked for {ident[:12]}), so its mounts cannot be checked; "
            "mount the socket of the engine it runs on, or set "
            f"{IN_CONTAINER_ENV}=0 if the state root and repositories are at the same paths "
            "on that engine's host."
        )
    _mounts = found
    return _mounts


def state_root_problem(home: Path) -> str | None:
    """Why task containers could not use the state root from this container (None: they can,
    or the bridge does not run in a container)."""
    if not in_container():
        return None
    return mount_problem(home.absolute(), own_mounts(), "The state root", HOME_ENV)


def require_state_root(home: Path) -> None:
    """Refuse (ConfigError, exit 2) to run tasks or serve when the state root is not shared."""
    problem = state_root_problem(home)
    if problem:
        raise ConfigError(problem)


def require_repository(repo: Path) -> None:
    """Refuse a task (InvalidSpec) on a repository that is not mounted at the same path."""
    if not in_container():
        return
    problem = mount_problem(repo, own_mounts(), "The repository")
    if problem:
        raise InvalidSpec(problem)


def deployment_checks(
    home: Path, env: Mapping[str, str] | None = None
) -> list[tuple[str, bool, str]]:
    """For doctor: (check, ok, detail) for the state root and each folder in
    $WORKER_BRIDGE_REPOS; nothing outside a container."""
    env = os.environ if env is None else env
    if not in_container(env):
        return []
    try:
        mounts = own_mounts()
    except BridgeError as exc:
        return [("paths", False, exc.message)]
    wanted = [("paths:home", "The state root", home.absolute(), HOME_ENV)]
    for raw in filter(None, env.get(REPOS_ENV, "").split(os.pathsep)):
        wanted.append(("paths:repos", "The repositories folder", Path(raw), REPOS_ENV))
    checks = []
    for name, what, path, setting in wanted:
        problem = mount_problem(path, mounts, what, setting)
        detail = problem or f"{what.removeprefix('The ')} {path} is at the same path as on the host"
        checks.append((name, problem is None, detail))
    return checks


def _engine_error(exc: Exception) -> BridgeError:
    return ConfigError(
        "The bridge runs in a container and cannot reach the Docker engine to check its mounts "
        f"({exc.__class__.__name__}); mount the engine's socket: "
        "-v /var/run/docker.sock:/var/run/docker.sock."
    )


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _hostname() -> str:
    return socket.gethostname()
