"""This machine as a node of the cluster: the `ray start` that joins it (`worker-bridge node
start`) and its stopping (`node stop`).

The command is built first and every argument checked (`plan_node`), so a bad name, slot count
or address is refused before anything starts. It runs as `ray start --block`, detached, as the
leader of a session of its own: the node's Ray processes are that session (its services in
the leader's process group, its workers each in a group of their own within it). Its pid and
start time (/proc/PID/stat field 22) are recorded in the node root (0600), and `node stop`
signals that group, and then each process left in the session, by that pid alone and only while
the recorded start time still matches, so a pid the kernel has reused is never touched. Never
`ray stop`: it finds processes by name, and would stop every Ray process of this user, a
control host's own among them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bridge.cluster.link import NODE_RESOURCE, SLOT_RESOURCE, node_root
from bridge.errors import BridgeError, ConfigError, InvalidSpec

NAME = re.compile(r"[a-z][a-z0-9-]{0,14}")  # as scripts/local-cluster names its nodes
HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
DOCKER_SCHEMES = ("unix://", "tcp://", "ssh://", "http://", "https://")
SLOT_MEMORY = 4 * 2**30  # a worker container's memory, roughly: slots = min(cores, memory / this)
MOST_SLOTS = 1024
STATE_FILE = "ray-node.json"
LOG_FILE = "ray-node.log"
SETTLE_S = 2.0  # a `ray start` still running after this long is taken as started
STOP_GRACE_S = 15.0  # TERM, then this long for the node's processes to end, then KILL
KILL_WAIT_S = 5.0
TAIL_LINES = 20
MISSING_RAY = (
    "Ray is not installed here; install worker-bridge's `cluster` extra "
    "(pip install 'worker-bridge[cluster]')."
)


@dataclass(frozen=True)
class NodeRequest:
    """What `node start` was asked for; None: the default."""

    address: str
    name: str | None = None
    slots: int | None = None
    docker_host: str | None = None
    root: Path | None = None
    insecure_no_token: bool = False


@dataclass(frozen=True)
class Machine:
    """What the slots' default is made of."""

    cores: int
    memory: int  # bytes

    @classmethod
    def here(cls) -> Machine:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return cls(len(os.sched_getaffinity(0)) or 1, memory)

    def default_slots(self) -> int:
        return max(1, min(self.cores, self.memory // SLOT_MEMORY))


@dataclass(frozen=True)
class NodeLaunch:
    """The checked `ray start` for this node: its command, its environment (the caller's, with
    the node root and the engine added) and where its state and log are kept."""

    name: str
    address: str
    slots: int
    root: Path
    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)  # may hold RAY_AUTH_TOKEN

    @property
    def state_file(self) -> Path:
        return self.root / STATE_FILE

    @property
    def log(self) -> Path:
        return self.root / LOG_FILE


@dataclass(frozen=True)
class NodeStarted:
    name: str
    address: str
    slots: int
    pid: int
    root: Path
    log: Path


@dataclass(frozen=True)
class NodeStopped:
    """``was_running``: False when the recorded node had already ended (its record is removed
    all the same); ``killed``: it did not end within the grace period after TERM."""

    name: str
    pid: int
    was_running: bool
    killed: bool = False


# -- the command -------------------------------------------------------------------------------


def default_node_name(hostname: str | None = None) -> str:
    """The host's name made a node name: its first label, lower case, anything else than
    a-z 0-9 - made a dash, starting at its first letter, at most 15 characters."""
    label = (hostname or socket.gethostname()).split(".")[0].lower()
    label = re.sub(r"[^a-z0-9-]+", "-", label)
    label = re.sub(r"^[^a-z]+", "", label)[:15].rstrip("-")
    return label or "node"


def chosen_root(name: str | None, root: Path | None) -> Path:
    """The node root: ``root`` when given, else the agent's own (`node_root`) for ``name``
    (default: this host's), made absolute: Ray's processes do not run in this one's folder."""
    return (root or node_root(name or default_node_name())).expanduser().absolute()


def plan_node(
    request: NodeRequest,
    *,
    environ: Mapping[str, str] | None = None,
    machine: Machine | None = None,
    ray: str | None = None,
) -> NodeLaunch:
    """The `ray start` for ``request``, every argument checked first (InvalidSpec, ConfigError:
    one sentence each). ``environ``, ``machine`` and ``ray`` default to this process's."""
    env = dict(os.environ if environ is None else environ)
    address = _checked_address(request.address)
    name = request.name if request.name is not None else default_node_name()
    if not NAME.fullmatch(name):
        raise InvalidSpec(
            f"--name {name!r} is not a node name: a lower-case letter, then up to 14 of "
            "a-z, 0-9 and -."
        )
    if request.slots is not None and not 1 <= request.slots <= MOST_SLOTS:
        raise InvalidSpec(f"--slots {request.slots} is out of range: give 1 to {MOST_SLOTS}.")
    docker_host = request.docker_host
    if docker_host is not None and not docker_host.startswith(DOCKER_SCHEMES):
        raise InvalidSpec(
            f"--docker-host {docker_host!r} is not an engine address: give one as DOCKER_HOST "
            "takes it (unix:///run/docker.sock, tcp://HOST:PORT, ssh://USER@HOST)."
        )
    _check_token(env, request.insecure_no_token)
    here = machine or Machine.here()
    slots = request.slots or here.default_slots()
    root = chosen_root(name, request.root)
    env["WORKER_BRIDGE_NODE_HOME"] = str(root)
    if docker_host is not None:
        env["DOCKER_HOST"] = docker_host
    resources = {f"{NODE_RESOURCE}{name}": 1, SLOT_RESOURCE: slots}
    argv = (
        ray or ray_executable(),
        "start",
        "--block",
        "--address",
        address,
        "--node-name",
        name,
        "--resources",
        json.dumps(resources),
        "--num-cpus",
        str(here.cores),
        "--disable-usage-stats",
    )
    return NodeLaunch(name, address, slots, root, argv, env)


def _checked_address(address: str) -> str:
    host, colon, port = address.rpartition(":")
    if not colon or not HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidSpec(
            f"--address {address!r} is not HOST:PORT; give the Ray head's address, "
            "e.g. 10.0.0.2:6379."
        )
    return address


def _check_token(env: Mapping[str, str], insecure: bool) -> None:
    """Token authentication must be on (docs/cluster.md): Ray reads its mode and the token's
    file from the environment, which `ray start` inherits."""
    if insecure:
        return
    mode = env.get("RAY_AUTH_MODE")
    if mode != "token":
        raise ConfigError(
            f"RAY_AUTH_MODE is {mode or 'unset'}, not `token`: set RAY_AUTH_MODE=token and "
            "RAY_AUTH_TOKEN_PATH to the cluster's token file (or pass --insecure-no-token to "
            "join a cluster without authentication)."
        )
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path and not os.access(path, os.R_OK):
        raise ConfigError(f"RAY_AUTH_TOKEN_PATH names {path}, which cannot be read.")


def ray_executable() -> str:
    """The `ray` of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).parent / "ray"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("ray")
    if found is None:
        raise BridgeError(MISSING_RAY, kind="cluster")
    return found


# -- the process -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """The `ray start` a `node start` launched, as its state file keeps it."""

    name: str
    address: str
    pid: int
    start: int  # /proc/PID/stat field 22: with the pid, names this one process

    @classmethod
    def read(cls, path: Path) -> Recorded | None:
        try:
            data = json.loads(path.read_text())
            pid = int(data["pid"])
            if pid <= 1:  # 0 and -1 are not a process to kill(2): they name groups of callers
                raise ValueError(f"pid {pid}")
            return cls(str(data["name"]), str(data["address"]), pid, int(data["start"]))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise BridgeError(
                f"{path} is not a node's record ({exc.__class__.__name__}); remove it once no "
                "Ray node of it runs.",
                kind="cluster",
            ) from exc

    def write(self, path: Path) -> None:
        """Atomically, 0600 from the start: a half-written record is never read."""
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(
                {"name": self.name, "address": self.address, "pid": self.pid, "start": self.start},
                out,
            )
        os.replace(partial, path)


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat from its third field on (the command's name may hold spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None  # field 22 of the whole line


def node_processes(record: Recorded) -> list[int]:
    """The live processes of the node's session (its id is the leader's pid), or none when
    that id may no longer be ours: a process holds the pid with another start time. (A pid is
    not reused while a session or group of that id has members, so with the leader gone and no
    process holding its pid, the members left are the node's.)"""
    leader = _stat(record.pid)
    if leader is not None and int(leader[19]) != record.start:
        return []
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields and int(fields[3]) == record.pid and fields[0] != "Z":  # a zombie has ended
            members.append(int(entry.name))
    return members


def start_node(launch: NodeLaunch, settle_s: float = SETTLE_S) -> NodeStarted:
    """Run ``launch``'s `ray start --block` detached, record it, and wait up to ``settle_s``:
    an exit by then is an error with the log's tail; still running, it is taken as started (it
    keeps trying to reach the head; its log says how that goes)."""
    launch.root.mkdir(mode=0o700, parents=True, exist_ok=True)  # the agent makes it private
    running = Recorded.read(launch.state_file)
    if running is not None and node_processes(running):
        raise BridgeError(
            f"Node {running.name} already runs here (pid {running.pid}, record "
            f"{launch.state_file}); stop it first with `worker-bridge node stop`.",
            kind="cluster",
        )
    with open(launch.log, "ab") as log:
        os.chmod(launch.log, 0o600)
        child = subprocess.Popen(
            launch.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=launch.env,
            start_new_session=True,  # its own session and group, for `node stop`
            close_fds=True,
        )
    started = start_time(child.pid)
    if started is not None:
        Recorded(launch.name, launch.address, child.pid, started).write(launch.state_file)
    try:
        code = child.wait(settle_s)
    except subprocess.TimeoutExpired:
        # Not waited for: it outlives this process. A returncode keeps Popen's finalizer from
        # warning of a running child.
        child.returncode = 0
        return NodeStarted(
            launch.name, launch.address, launch.slots, child.pid, launch.root, launch.log
        )
    launch.state_file.unlink(missing_ok=True)
    raise BridgeError(
        f"`ray start` exited with status {code} at once; the end of its log ({launch.log}):\n"
        + log_tail(launch.log),
        kind="cluster",
    )


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_bytes()[-16_384:].decode(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def stop_node(root: Path, grace_s: float = STOP_GRACE_S) -> NodeStopped:
    """Stop the node `node start` recorded in ``root``: TERM to its processes, KILL when
    they have not ended ``grace_s`` later; then its record is removed. BridgeError when none is
    recorded there."""
    state = root / STATE_FILE
    record = Recorded.read(state)
    if record is None:
        raise BridgeError(
            f"No node started by `worker-bridge node start` is recorded in {root} "
            "(give the --name or --root it was started with).",
            kind="cluster",
        )
    if not node_processes(record):
        state.unlink(missing_ok=True)
        return NodeStopped(record.name, record.pid, was_running=False)
    _signal(record, signal.SIGTERM)
    killed = not _ended(record, grace_s)
    if killed:
        _signal(record, signal.SIGKILL)
        if not _ended(record, KILL_WAIT_S):
            raise BridgeError(
                f"Node {record.name}'s processes (session {record.pid}) did not end after KILL.",
                kind="cluster",
            )
    state.unlink(missing_ok=True)
    return NodeStopped(record.name, record.pid, was_running=True, killed=killed)


def _signal(record: Recorded, signum: signal.Signals) -> None:
    """The leader's group at once (Ray's services), then each process left in the session
    (Ray's workers, each in a group of its own), each found again right before."""
    try:
        if node_processes(record):
            with contextlib.suppress(ProcessLookupError):  # the group ended; the session not
                os.killpg(record.pid, signum)
        for pid in node_processes(record):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
    except PermissionError as exc:
        raise BridgeError(
            f"Node {record.name}'s processes (session {record.pid}) are not this user's to stop.",
            kind="cluster",
        ) from exc


def _ended(record: Recorded, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while node_processes(record):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
