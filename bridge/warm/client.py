"""The `worker-bridge` console script: the command run by the warm process when one answers,
else run here (and a warm process started for the next command). Standard library only, and
only what a connection needs: this module's imports are the whole start-up of a warm command.

A command is handed over only to a socket in a folder that is this user's alone (mode 0700,
not a link) whose listener runs as this user (`SO_PEERCRED`): the request carries the
environment and the standard streams. Until the child has said it started, nothing ran, so any
failure before that runs the command here instead; after it, the exit status is the child's,
and the signals this process gets (Ctrl-C, a `kill`) are passed to the child."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import struct
import sys
import zlib

SWITCH = "WORKER_BRIDGE_WARM"  # "0", "off", "false" or "no": never use or start one
FOLDER = "WORKER_BRIDGE_WARM_DIR"  # where the socket is (default below)
REPORT = "WORKER_BRIDGE_WARM_REPORT"  # the bench's: a file the served child's usage goes to
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
HEADER = struct.Struct("!I")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def folder() -> str:
    """The sockets' folder: $WORKER_BRIDGE_WARM_DIR, else $XDG_RUNTIME_DIR/worker-bridge, else
    /tmp/worker-bridge-UID."""
    explicit = os.environ.get(FOLDER)
    if explicit:
        return os.path.abspath(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "worker-bridge")
    return f"/tmp/worker-bridge-{os.getuid()}"


def name() -> str:
    """One warm process per interpreter, installed package and interpreter settings: a process
    loaded from another install, or with another PYTHONPATH, never serves this one."""
    python = sorted((k, v) for k, v in os.environ.items() if k.startswith("PYTHON"))
    interpreter = [sys.prefix, os.path.realpath(sys.executable)]  # the venv, the binary
    key = json.dumps([*interpreter, _PACKAGE, python, sys.flags[:]])
    return f"{zlib.crc32(key.encode('utf-8', 'surrogateescape')):08x}"


def private_folder(path: str) -> bool:
    """Whether ``path`` is a real folder (not a link), owned by this user, that no one else may
    enter: a socket planted in any other folder could be someone else's listener."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def peer_is_me(sock: socket.socket) -> bool:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()


def connect(path: str) -> socket.socket | None:
    """A connection to the warm process at ``path``, or None (none there, or not ours)."""
    if not private_folder(os.path.dirname(path)):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        if peer_is_me(sock):
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


def _streams() -> tuple[list[int], list[int]]:
    """The descriptors to hand over: 0, 1 and 2 (/dev/null for a closed one), and this working
    folder; plus the ones opened here, to close after sending."""
    fds, opened = [], []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            opened.append(os.open(os.devnull, os.O_RDWR))
            fds.append(opened[-1])
    opened.append(os.open(".", os.O_RDONLY | os.O_DIRECTORY))
    fds.append(opened[-1])
    return fds, opened


def _request() -> dict:
    mask = os.umask(0)
    os.umask(mask)
    streams = [
        [getattr(s, "encoding", None) or "utf-8", getattr(s, "errors", None) or "strict"]
        for s in (sys.stdin, sys.stdout, sys.stderr)
    ]
    return {"argv": sys.argv, "env": dict(os.environ), "umask": mask, "streams": streams}


def hand_over(sock: socket.socket) -> int | None:
    """Run the command in the warm process; its exit status, or None when it did not start
    (the caller runs it here)."""
    fds, opened = _streams()
    try:
        send_message(sock, _request(), fds)
    except OSError:
        return None
    finally:
        for fd in opened:
            os.close(fd)
    buffer = bytearray()
    try:
        started = read_message(sock, buffer)
    except (OSError, ValueError):
        return None
    if not started or "pid" not in started:
        return None  # refused (its code changed since it loaded, or it is stopping): not run
    pid = started["pid"]
    for signum in FORWARDED:
        signal.signal(signum, lambda s, _f: _forward(pid, s))
    try:
        ended = read_message(sock, buffer)
    except (OSError, ValueError):
        ended = None
    if not ended or "exit" not in ended:
        print(
            f"worker-bridge: the warm process was lost; command {pid}'s end is unknown",
            file=sys.stderr,
        )
        return 1
    _report(ended)
    return ended["exit"]


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


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


def start_server(base: str, server_name: str) -> None:
    """Start a warm process for ``base``/``server_name`` in a session of its own, with a
    minimal environment (each command brings its own); it gives up at once if one runs."""
    import subprocess

    keep = ("PATH", "HOME", "LANG", "TMPDIR", "XDG_RUNTIME_DIR")
    prefixes = ("LC_", "PYTHON", "WORKER_BRIDGE_WARM_")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith(prefixes)}
    try:
        subprocess.Popen(
            [sys.executable, "-P", "-m", "bridge.warm.server", base, server_name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd="/",  # -P and this: never a `bridge` of the folder the command ran in
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        pass


def exit_like(code: int) -> None:
    """End this process as the child ended: with its code, or by its signal."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


def run() -> None:
    """The console script."""
    if enabled():
        base = folder()
        server_name = name()
        sock = connect(os.path.join(base, server_name + ".sock"))
        if sock is not None:
            code = hand_over(sock)
            if code is not None:
                sys.stdout.flush()
                exit_like(code)
            sock.close()
        start_server(base, server_name)
    from bridge.cli import run as run_here

    run_here()
