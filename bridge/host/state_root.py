"""The state root is the bridge's user's alone: made 0700 with the folders the bridge keeps
directly under it (`LAYOUT`), and repaired to 0700, with a warning, where others could enter it
(a state root an older version made 0755, one made by hand, a volume).

Everything under it (worktrees of private repositories, the store, diffs, object packs of the
base's history, prompts, the gateways' sockets, the pool's control files, prepared
verification checkouts) is then reached by path by the bridge's user alone: by no other local
user and, under a root bridge, by no host process running as the sandbox uid, whatever the
modes deeper down (containers reach what they need through their bind mounts, which the engine
resolves as root, never through the host's parents). `make_private` runs once per process and
state root, before anything else touches it: from the facade (every front end) and from the
context every runner and coordinator builds from a recorded configuration. `exposure` says the
same without changing anything (doctor). Standard library only."""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path

from bridge.errors import ConfigError

PRIVATE = 0o700
# The folders the bridge keeps directly under the state root, made 0700 with it. Not `python`:
# verification containers mount that folder itself, and the sandbox uid must read it.
LAYOUT = (
    "bases",
    "bundles",
    "environments",
    "gateways",
    "gitdirs",
    "jobs",
    "layers",
    "locks",
    "logs",
    "mounts",
    "objects",
    "pool",
    "rawgit",
    "tasks",
    "trash",
    "worktrees",
)

_log = logging.getLogger("worker_bridge.state_root")
_DONE: set[str] = set()
_LOCK = threading.Lock()


def make_private(home: Path) -> None:
    """Make ``home`` (resolved: a state root reached through a link is the folder it names) and
    the folders of `LAYOUT` 0700, creating what is missing; a state root others could enter is
    repaired, with one warning. ConfigError when it is not a folder, or when it is another
    user's."""
    real = os.path.realpath(home)
    if real in _DONE:
        return
    with _LOCK:
        if real in _DONE:
            return
        root = Path(real)
        made = _mkdir(root, parents=True)
        if not made:
            _require_own(root)
        repaired = [] if made else _close(root, f"{root} was")
        for name in LAYOUT:
            if not _mkdir(root / name, parents=False):
                repaired += _close(root / name, f"{name}/ was")
        if repaired:
            _log.warning(
                "worker-bridge: the state root %s was open to other local users (%s): made "
                "0700, so that its worktrees, store and diffs are this user's alone",
                root,
                ", ".join(repaired),
            )
        _DONE.add(real)


def _require_own(root: Path) -> None:
    """ConfigError unless this user owns the state root: another user's folder (one made
    beforehand under /tmp, say) is theirs to open again, and to fill with links a root bridge
    would follow, whatever mode the bridge gives it."""
    st = os.stat(root)
    if st.st_uid == os.geteuid():
        return
    mode = stat.S_IMODE(st.st_mode)
    opened = f" and open to other local users (mode {mode:04o})" if mode & 0o077 else ""
    raise ConfigError(
        f"The state root {root} belongs to uid {st.st_uid}, not to this user "
        f"({os.geteuid()}){opened}; point WORKER_BRIDGE_HOME at a folder of this user's own, "
        f"or have it made this user's with `chown -R {os.geteuid()} {root}`."
    )


def exposure(home: Path) -> str | None:
    """Why other local users can reach into ``home`` (its mode, a `LAYOUT` folder's, another
    owner), or None: it is private, or does not exist yet (it will be made private)."""
    try:
        st = os.stat(home)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return f"{home} is not a folder"
    if st.st_uid != os.geteuid():
        return f"{home} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})"
    found = [f"{home} is {stat.S_IMODE(st.st_mode):04o}"] if st.st_mode & 0o077 else []
    for name in LAYOUT:
        try:
            child = os.lstat(Path(home) / name)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(child.st_mode) and child.st_mode & 0o077:
            found.append(f"{name}/ is {stat.S_IMODE(child.st_mode):04o}")
    return "; ".join(found) or None


def _mkdir(path: Path, *, parents: bool) -> bool:
    """Make ``path`` 0700 (whatever the umask); False when it existed."""
    try:
        path.mkdir(mode=PRIVATE, parents=parents)
    except FileExistsError:
        return False
    return True


def _close(path: Path, said: str) -> list[str]:
    """Take the group and other bits off the folder ``path`` (opened without following a
    link); what was open, for the warning (``said`` and the old mode), or []."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(
            f"{path} is not a folder this user can open ({exc.strerror}); point "
            "WORKER_BRIDGE_HOME at a folder of its own."
        ) from exc
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if not mode & 0o077:
            return []
        try:
            os.fchmod(fd, mode & ~0o077)
        except OSError as exc:
            raise ConfigError(
                f"The state root folder {path} is open to other local users (mode {mode:04o}) "
                f"and this user cannot close it ({exc.strerror}); run `chmod 700 {path}` as "
                "its owner, or set WORKER_BRIDGE_HOME elsewhere."
            ) from exc
    finally:
        os.close(fd)
    return [f"{said} {mode:04o}"]
