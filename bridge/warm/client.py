"""The `worker-bridge` console script: the command run by the warm process when one answers,
else run here (and a warm process started for the next command). Standard library only, and
only what a connection needs: this module's imports are the whole start-up of a warm command.

A command is handed over only to a socket in a folder that is this user's alone (mode 0700,
not a link) whose listener runs as this user (`SO_PEERCRED`), and only to a warm process of
the same kind (`name`: the same interpreter, package, import-time settings and security
context, which the warm process checks again from its side): the request carries the
environment and the standard streams. Until the child has said it started, nothing ran, so any
failure before that runs the command here instead; after it, the exit status is the child's,
and the signals this process gets (Ctrl-C, a `kill`, Ctrl-Z) are passed to the child."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import zlib

SWITCH = "WORKER_BRIDGE_WARM"  # "0", "off", "false" or "no": never use or start one
FOLDER = "WORKER_BRIDGE_WARM_DIR"  # where the socket is (default below)
REPORT = "WORKER_BRIDGE_WARM_REPORT"  # the bench's: a file the served child's usage goes to
# The variables a module may read as it is imported (the interpreter's, the locale, TLS's trust
# store: aiohttp builds its default context then): a warm process has the same as its clients.
IMPORT_TIME = ("PYTHON", "LC_", "LANG", "SSL_CERT_", "OTEL_")
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)
KEPT_IGNORED = (
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGTSTP,
    signal.SIGTTIN,
    signal.SIGTTOU,
)
HEADER = struct.Struct("!I")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STATUS_KEYS = (
    b"Groups",
    b"NoNewPrivs",
    b"Seccomp",
    b"CapInh",
    b"CapPrm",
    b"CapEff",
    b"CapBnd",
    b"CapAmb",
)
_NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def folder() -> str:
    """The sockets' folder: $WORKER_BRIDGE_WARM_DIR, else $XDG_RUNTIME_DIR/worker-bridge when
    that is a private folder of this user's, else /tmp/worker-bridge-UID."""
    explicit = os.environ.get(FOLDER)
    if explicit:
        return os.path.abspath(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and private_folder(runtime):
        return os.path.join(runtime, "worker-bridge")
    return f"/tmp/worker-bridge-{os.getuid()}"


def import_time_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(IMPORT_TIME)}


def context(pid: int | str = "self") -> str:
    """What a process may do beyond its uid: its groups, no-new-privileges and seccomp flags,
    capabilities, namespaces and cgroup. A command forked by the warm process has the warm
    process's, so it serves only callers that have the same (a caller confined by any of them
    is never handed an unconfined child)."""
    with open(f"/proc/{pid}/status", "rb") as f:
        lines = [line for line in f if line.split(b":", 1)[0] in _STATUS_KEYS]
    with open(f"/proc/{pid}/cgroup", "rb") as f:
        lines.append(f.read())
    lines += [os.readlink(f"/proc/{pid}/ns/{ns}").encode() for ns in _NAMESPACES]
    return b"".join(lines).decode("utf-8", "surrogateescape")


def name() -> str:
    """One warm process per interpreter, installed package, import-time settings, interpreter
    flags and security context: any other never serves this one."""
    interpreter = [sys.prefix, os.path.realpath(sys.executable), _PACKAGE, sys.flags[:]]
    key = json.dumps([interpreter, sorted(import_time_environment().items()), context()])
    return f"{zlib.crc32(key.encode('utf-8', 'surrogateescape')):08x}"


def private_folder(path: str) -> bool:
    """Whether ``path`` is a real folder (not a link), owned by this user, that no one else may
    enter: a socket planted in any other folder could be someone else's listener."""
    try:
        return private(os.lstat(path))
    except OSError:
        return False


def private(st: os.stat_result) -> bool:
    """Whether ``st`` is a folder of this user's that no one else may enter."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def peer(sock: socket.socket) -> tuple[int, int]:
    """The process across ``sock``: its pid and uid."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def connect(path: str) -> socket.socket | None:
    """A connection to the warm process at ``path``, or None (none there, or not ours)."""
    if not private_folder(os.path.dirname(path)):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        if peer(sock)[1] == os.getuid():
            return sock
    except OSError:
        pass
    sock.close()
    return None


def send_message(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    data = HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def read_message(sock: socket.socket, buffer: bytearray) -> dict | None:
    """The next message on ``sock`` (``buffer`` keeps what came after it), or None at its end."""
    while True:
        if len(buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer)
            if len(buffer) >= HEADER.size + size:
                message = json.loads(buffer[HEADER.size : HEADER.size + size])
                del buffer[: HEADER.size + size]
                return message
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buffer += chunk


def _open_standard_fds() -> None:
    """/dev/null in place of a closed 0, 1 or 2, before any other descriptor is opened: else the
    socket would take its number and be handed over as the command's stream."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)


def _ignored() -> list[int]:
    return [s for s in KEPT_IGNORED if signal.getsignal(s) == signal.SIG_IGN]


def _request() -> dict:
    mask = os.umask(0)
    os.umask(mask)
    streams = [
        [
            getattr(s, "encoding", None) or "utf-8",
            getattr(s, "errors", None) or "strict",
            bool(getattr(s, "line_buffering", False)),
            bool(getattr(s, "write_through", False)),
        ]
        for s in (sys.stdin, sys.stdout, sys.stderr)
    ]
    limits = [
        [getattr(resource, n), *resource.getrlimit(getattr(resource, n))]
        for n in dir(resource)
        if n.startswith("RLIMIT_")
    ]
    return {
        "argv": sys.argv,
        "env": dict(os.environ),
        "umask": mask,
        "streams": streams,
        "limits": limits,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "ignored": _ignored(),
    }


def hand_over(sock: socket.socket) -> int | None:
    """Run the command in the warm process; its exit status, or None when it did not start
    (the caller runs it here)."""
    request = _request()
    cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        send_message(sock, request, [0, 1, 2, cwd])
    except OSError:
        return None
    finally:
        os.close(cwd)
    buffer = bytearray()
    try:
        started = read_message(sock, buffer)
    except (OSError, ValueError):
        return None
    if not started or "pid" not in started:
        return None  # refused (its code changed since it loaded, or it is stopping): not run
    pid = started["pid"]
    child = _pidfd(pid)
    _relay_signals(pid, request["ignored"])
    try:
        ended = read_message(sock, buffer)
    except (OSError, ValueError):
        ended = None
    if ended and "exit" in ended:
        _report(ended)
        return ended["exit"]
    if child is not None:  # the warm process is gone, the command maybe not: wait for it
        select.select([child], [], [])
    print(
        f"worker-bridge: the warm process was lost; command {pid}'s exit status is unknown",
        file=sys.stderr,
    )
    return 1


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _relay_signals(pid: int, ignored: list[int]) -> None:
    """Signals this process gets go to the command, but for those it was started ignoring
    (``ignored``: the command ignores them too); Ctrl-Z stops the command, then this process,
    and what continues this process continues it."""

    def forward(signum: int, _frame: object) -> None:
        stop = signum == signal.SIGTSTP  # discarded in the child's orphaned group: SIGSTOP
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGSTOP if stop else signum)
        if stop:
            os.kill(os.getpid(), signal.SIGSTOP)

    for signum in (*FORWARDED, signal.SIGTSTP):
        if signum not in ignored:
            signal.signal(signum, forward)
    signal.signal(signal.SIGCONT, forward)


def _report(ended: dict) -> None:
    path = os.environ.get(REPORT)
    if path:
        with open(path, "w") as out:
            json.dump(ended, out)


def control(request: str, path: str | None = None) -> dict | None:
    """Ask this interpreter's warm process (or the one at ``path``) for its ``status`` or to
    ``stop``; its answer, or None when none answers."""
    sock = connect(path or os.path.join(folder(), name() + ".sock"))
    if sock is None:
        return None
    with sock:
        try:
            send_message(sock, {request: True})
            return read_message(sock, bytearray())
        except (OSError, ValueError):
            return None


def stop_all(base: str | None = None, deadline_s: float = 60.0) -> int:
    """Stop every warm process of ``base`` (default: this user's folder), whatever its name,
    one still loading too: each is found by its lock, held from before it loads until it stops
    taking commands. Returns how many were stopped; a command one still runs ends on its own."""
    import fcntl
    import glob
    import time

    def held(lock: str) -> bool:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    base = base or folder()
    if not private_folder(base):
        return 0
    deadline, stopped = time.monotonic() + deadline_s, 0
    for lock in glob.glob(os.path.join(glob.escape(base), "*.lock")):
        stopped += held(lock)
        while held(lock):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the warm process of {lock} did not stop")
            control("stop", lock.removesuffix(".lock") + ".sock")
            time.sleep(0.1)
    return stopped


def start_server(base: str, server_name: str) -> None:
    """Start a warm process for ``base``/``server_name`` in a session of its own, with a
    minimal environment (each command brings its own); it gives up at once if one runs. None
    is started for a folder that exists and is not private (it would refuse it)."""
    if os.path.lexists(base) and not private_folder(base):
        return
    import subprocess

    keep = ("PATH", "HOME", "TMPDIR", "XDG_RUNTIME_DIR")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("WORKER_BRIDGE_WARM_")}
    try:
        subprocess.Popen(
            [sys.executable, "-P", "-m", "bridge.warm.server", base, server_name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**env, **import_time_environment()},
            cwd="/",  # -P and this: never a `bridge` of the folder the command ran in
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        pass


def exit_like(code: int) -> None:
    """End this process as the child ended: with its code, or by its signal."""
    if code < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's disposition is fixed
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


def run() -> None:
    """The console script."""
    if enabled():
        _open_standard_fds()
        base = folder()
        server_name = name()
        sock = connect(os.path.join(base, server_name + ".sock"))
        if sock is not None:
            code = hand_over(sock)
            if code is not None:
                exit_like(code)
            sock.close()
        start_server(base, server_name)
    from bridge.cli import run as run_here

    run_here()
