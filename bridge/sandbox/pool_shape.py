"""What a pooled container is made of, apart from the pool's bookkeeping (bridge/sandbox/pool.py):
the *shape* of a task container (everything fixed when a container is created: image id, user,
working folder, runtime, limits, read-only root, tmpfs, log bound, entrypoint, role, state root,
and where each mount goes), the idle container of that shape, the slot folder it mounts, and
the release script that turns it into the task's container.

A pooled container is created from the task's own spec with three differences only: its mounts
are the slot's empty points (read-only, `rslave`), one more read-only folder (the control
folder, at `/run/worker-bridge-pool`) holds a FIFO, and its command waits on that FIFO.
Claiming it, the host attaches the task's sources onto the slot's points (they appear at the
same targets inside), writes the release script (the task's command, environment and working
folder) into the control folder, and closes the FIFO; the container's PID 1 then reads the
script and `exec`s the command, so its exit, output, engine log, memory and the kill of a
timeout are the container's own, as for a container made cold.

The release is the host's alone. The FIFO only says *when*: its end is the host closing it,
and it carries nothing. *What* runs is read from the release file, which only the bridge can
write: the control folder and both files are root's (0755, 0644), bound read-only. A process
running as the sandbox uid, on the host or in the container, can read them (and the idle
container's command line and environment, which hold no secret) but can neither write nor
replace either; opening the FIFO to read it takes nothing from PID 1, which wakes when the
host's writer closes, whatever other readers do."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from bridge.sandbox.spec import LABEL, ContainerSpec, Mount

CONTROL = "/run/worker-bridge-pool"  # the control folder inside a pooled container
FIFO = "go"  # when: PID 1 goes on once the host's writer closes it
RELEASE = "release"  # what: the release script, written whole (renamed into place) first
RELEASE_TMP = ".release.tmp"
TOKEN = "token"  # in the slot folder (not mounted): the name of its points' sentinel
# PID 1 of an idle pooled container: wait for the host, run its release script (which ends in
# `exec`); without one (a host that died), nothing.
INIT = f'cat {CONTROL}/{FIFO} >/dev/null; eval "$(cat {CONTROL}/{RELEASE})"; exit 125'
NOT_MOUNTED = 125  # the release script's exit when a point still shows the slot's own entry
POOLED_ROLES = ("worker", "verify")
RUNC = (None, "runc", "io.containerd.runc.v2")  # where host mounts reach a started container
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Point:
    """A top-level mount target of the shape, and what its source is (dir or file)."""

    target: str
    kind: str


@dataclass
class Plan:
    """A task container's spec, seen as a shape plus what is the task's own."""

    spec: ContainerSpec
    image_id: str
    points: tuple[Point, ...]
    tops: list[Mount]  # one per point, in the same order
    nested: list[tuple[int, str, Mount]]  # (its point's index, path under it, the mount)
    key: str

    @property
    def role(self) -> str:
        return self.spec.labels.get(f"{LABEL}.role", "")

    @property
    def home(self) -> str:
        return self.spec.labels.get(f"{LABEL}.home", "")


def why_not(spec: ContainerSpec) -> str | None:
    """Why ``spec`` cannot come from the pool (None: it can)."""
    if spec.runtime and "runsc" in spec.runtime:
        return (
            "the pool is not used under gVisor (runsc): its sandbox would not see mounts the host "
            "makes after it started; the container was made cold"
        )
    if spec.runtime not in RUNC:
        return f"the pool is used with runc only, not with the runtime {spec.runtime}"
    if os.geteuid() != 0:
        return "the bridge does not run as root: it cannot attach a task's folders to a slot"
    if not re.fullmatch(r"\d+:\d+", spec.user):
        return f"the container user {spec.user!r} is not uid:gid"
    if any(not _NAME.match(k) or "\0" in v for k, v in spec.env.items()):
        return "an environment variable's name cannot be set from a shell"
    if any(m.propagation for m in spec.mounts):
        return "a mount already has a propagation of its own"
    return None


def make_plan(spec: ContainerSpec, image_id: str) -> Plan | str:
    """The shape of ``spec`` with ``image_id`` (its image's current id), or why it has none."""
    tops: list[Mount] = []
    nested: list[tuple[int, str, Mount]] = []
    ordered = sorted(spec.mounts, key=lambda m: (m.target.rstrip("/").count("/"), m.target))
    for mount in ordered:
        target = mount.target.rstrip("/") or "/"
        parent = next(
            (i for i, top in enumerate(tops) if target.startswith(top.target.rstrip("/") + "/")),
            None,
        )
        if parent is None:
            if any(t.target == target for t in tops):
                return f"two mounts go to {target}"
            tops.append(replace(mount, target=target))
        else:
            nested.append((parent, target[len(tops[parent].target.rstrip("/")) + 1 :], mount))
    points = []
    for mount in tops:
        if not os.path.exists(mount.source):
            return f"the mount source {mount.source} is missing"
        points.append(Point(mount.target, "dir" if os.path.isdir(mount.source) else "file"))
    fixed = [
        image_id,
        spec.user,
        spec.workdir,
        spec.memory_mb,
        spec.cpus,
        spec.pids,
        spec.runtime,
        list(spec.tmpfs),
        spec.log_max_mb,
        spec.entrypoint,
        spec.read_only_root,
        [[p.target, p.kind] for p in points],
        spec.labels.get(f"{LABEL}.role"),
        spec.labels.get(f"{LABEL}.home"),
    ]
    key = hashlib.sha256(json.dumps(fixed).encode()).hexdigest()[:24]
    return Plan(spec, image_id, tuple(points), tops, nested, key)


def make_slot(folder: Path, plan: Plan) -> None:
    """The slot folder of a new pooled container of ``plan``'s shape (the bridge's alone,
    0700): its control folder with the FIFO (root's, 0755 and 0644: the container's user reads
    them, only the bridge writes), one point per top-level mount, each holding the slot's
    sentinel (a random name: no task's tree can be told it in advance)."""
    folder.mkdir(mode=0o700)
    token = f".worker-bridge-pool-{secrets.token_hex(8)}"
    (folder / TOKEN).write_text(token)
    control = folder / "ctl"
    control.mkdir(mode=0o755)
    control.chmod(0o755)
    os.mkfifo(control / FIFO, 0o644)
    os.chmod(control / FIFO, 0o644)  # whatever the umask: read by the container, never written
    for index, point in enumerate(plan.points):
        path = folder / f"m{index}"
        if point.kind == "dir":
            path.mkdir(mode=0o755)
            (path / token).write_bytes(b"")
        else:
            path.write_text(token + "\n")
            path.chmod(0o644)


def write_release(control: Path, script: bytes) -> None:
    """The release script in the control folder, whole or not at all (written beside it, then
    renamed into place): root's, 0644."""
    tmp = control / RELEASE_TMP
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(script)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    os.replace(tmp, control / RELEASE)


def pooled_spec(plan: Plan, folder: Path, slot_id: str, owner: str) -> ContainerSpec:
    """The idle container of ``plan``'s shape in the slot ``folder``: the task's spec with the
    slot's points as its mounts, the control folder, no environment, and the waiting init."""
    spec = plan.spec
    mounts = [Mount(folder / "ctl", CONTROL, read_only=True, propagation="rslave")]
    mounts += [
        Mount(folder / f"m{index}", point.target, read_only=True, propagation="rslave")
        for index, point in enumerate(plan.points)
    ]
    # Not `.role`: an idle container is no task's worker or verifier (whoever counts those by
    # the engine's labels must not count it); the role it is for is `.pool_role`.
    labels = {
        f"{LABEL}.home": plan.home,
        f"{LABEL}.pool_role": plan.role,
        f"{LABEL}.pool": owner,
        f"{LABEL}.slot": slot_id,
    }
    return replace(
        spec,
        image=plan.image_id,
        command=["sh", "-c", INIT],
        labels=labels,
        mounts=mounts,
        env={},
    )


def release_script(plan: Plan, spec: ContainerSpec, token: str) -> str:
    """What the pooled container's PID 1 runs for the task: refuse (exit 125) when a point
    still shows the slot's own entry (the task's folder did not reach it), enter the working
    folder again (the one PID 1 started in is the slot's), set the task's environment, and
    become the task's command; all or nothing (see the end)."""
    q = shlex.quote
    lines = []
    for point in plan.points:
        if point.kind == "dir":
            lines.append(f"[ -e {q(point.target + '/' + token)} ] && exit {NOT_MOUNTED}")
        else:
            lines.append(
                f"IFS= read -r wb_line < {q(point.target)} 2>/dev/null; "
                f'[ "$wb_line" = {q(token)} ] && exit {NOT_MOUNTED}'
            )
    lines.append("unset wb_line")
    lines.append(f"cd -- {q(spec.workdir)} || exit {NOT_MOUNTED}")
    lines += [f"export {q(f'{k}={v}')}" for k, v in spec.env.items()]
    lines.append("exec " + " ".join(q(part) for part in spec.command))
    # One function, called on the last line: a script cut short (the host died while writing
    # it) does not parse, or defines without calling, so PID 1 runs none of it (exit 125),
    # never a command with its last arguments missing.
    body = "".join(f"  {line}\n" for line in lines)
    return f"wb_release() {{\n{body}}}\nwb_release\n"


def sentinel_shown(root: Path, plan: Plan, token: str) -> str | None:
    """The first point of ``plan`` that still shows the slot's sentinel under ``root`` (a
    container's root seen from the host, /proc/PID/root), or None: none does, or one cannot
    tell. The walk refuses a link at every step: an absolute link in the container's image
    would otherwise lead the host, as root, to one of its own files (a FIFO that blocks the
    open, a device whose open acts); and a point that is not a plain folder or file is read
    as not showing it."""
    try:
        top = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return next((p.target for p in plan.points if _shows(top, p, token)), None)
    finally:
        os.close(top)


def _shows(top: int, point: Point, token: str) -> bool:
    fd = os.dup(top)
    try:
        for part in [p for p in point.target.split("/") if p]:
            child = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child  # a link here is an O_PATH to the link: the next step fails, not follows
        mode = os.fstat(fd).st_mode
        if point.kind == "dir" and stat.S_ISDIR(mode):
            os.stat(token, dir_fd=fd, follow_symlinks=False)
            return True  # the slot's own folder: the task's did not reach it
        if point.kind == "file" and stat.S_ISREG(mode):
            with open(f"/proc/self/fd/{fd}", "rb") as file:
                return file.read(len(token) + 2).strip() == token.encode()
        return False
    except OSError:
        return False
    finally:
        os.close(fd)
