"""The warm process (`python -m bridge.warm.server FOLDER NAME`): load the CLI and everything
its commands import, then fork one child per command handed over on FOLDER/NAME.sock
(bridge/warm/client.py). The child becomes the command: a session of its own, the client's
standard streams, working folder, umask, environment and argument list, then the CLI's own
`main()` and the ending of `bridge.cli.run`. The parent only forks, reports each child's exit
status and resource usage to its client, and kills a child whose client went away unannounced
(a client killed outright: a command killed outright ends too).

It serves this user only (a private folder, `SO_PEERCRED`), never two at once per name (a
lock), and never from stale code: a command arriving after any loaded `bridge` file or any
folder of `sys.path` changed is refused (the client runs it itself) and the process stops. It
stops after IDLE_S without a command (`WORKER_BRIDGE_WARM_IDLE_S`), or on SIGTERM or a stop
request, once its running children have ended; the children themselves are never waited on by
anything but it, and are not in its process group."""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import io
import os
import pkgutil
import selectors
import signal
import socket
import sys
import threading
import time
import traceback

from bridge.warm.client import (
    peer_is_me,
    private_folder,
    read_message,
    send_message,
)

IDLE_S = 900.0
LOCK_WAIT_S = 3.0  # for a stopping predecessor to let go of the lock


def _lock(base: str, name: str) -> int | None:
    """This name's lock, held for the process's life; None when another live process holds it
    (or the folder cannot be made private)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o700)
    if not private_folder(base):
        return None
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(os.path.join(base, name + ".lock"), flags, 0o600)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def preload() -> None:
    """Import what commands import: every module of the package (its `__main__` modules run
    something, and are left out) and so the libraries they use; a module that cannot load here
    (an optional dependency) is left to the command that needs it."""
    import bridge

    for module in pkgutil.walk_packages(bridge.__path__, "bridge."):
        if module.name.rsplit(".", 1)[-1] in ("__main__", "sitecustomize"):
            continue
        with contextlib.suppress(Exception):
            importlib.import_module(module.name)


def stamp() -> dict[str, tuple[int, int]]:
    """The loaded code's state: each loaded `bridge` module's file and each `sys.path` folder
    (an install or removal there changes it), by modification time and size."""
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        named = module.__name__
        if path and (named in ("bridge", "__main__") or named.startswith("bridge.")):
            paths.append(path)
    found = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        found[path] = (st.st_mtime_ns, st.st_size)
    return found


def exit_code(exc: SystemExit) -> int:
    """What the interpreter makes of a SystemExit."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


class Server:
    def __init__(self, base: str, name: str, lock_fd: int, idle_s: float) -> None:
        self.path = os.path.join(base, name + ".sock")
        self.lock_fd = lock_fd
        self.idle_s = idle_s
        self.loaded = stamp()
        self.selector = selectors.DefaultSelector()
        # pid: (its client, its pidfd, this process's CPU time spent forking it)
        self.children: dict[int, tuple[socket.socket, int, float]] = {}
        self.stopping = False
        self.last = time.monotonic()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mask = os.umask(0o177)
        try:
            self.listener.bind(self.path)
        finally:
            os.umask(mask)
        self.inode = os.stat(self.path).st_ino  # to remove only its own socket at the end
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ, self._accept)

    def serve(self) -> None:
        self.wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # a SIGTERM ends a select
        signal.set_wakeup_fd(self.wake[1])
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        self.selector.register(self.wake[0], selectors.EVENT_READ, lambda fd: os.read(fd, 512))
        while not (self.stopping and not self.children):
            timeout = None if self.children else self.last + self.idle_s - time.monotonic()
            if timeout is not None and timeout <= 0:
                break
            for key, _ in self.selector.select(timeout):
                try:
                    key.data(key.fileobj)
                except Exception:  # noqa: BLE001  # logged; the other children still report
                    traceback.print_exc()
        self.stop()

    def stop(self) -> None:
        """Take no more commands: the socket goes (if it is still ours); the children that run
        still have their status reported."""
        if self.stopping:
            return
        self.stopping = True
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        self.listener.close()

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        self.last = time.monotonic()
        try:
            conn.settimeout(5.0)  # a client that connects and sends nothing holds no one up
            if not peer_is_me(conn):
                raise OSError("another user")
            message, fds = _receive(conn)
        except (OSError, ValueError):
            conn.close()
            return
        try:
            if message.get("stop"):
                self.stop()
                send_message(conn, {"stopping": True})
            elif message.get("status"):
                send_message(conn, {"server": os.getpid(), "children": sorted(self.children)})
            elif stamp() != self.loaded or threading.active_count() != 1:
                send_message(conn, {"refused": "the installed code changed since it loaded"})
                self.stop()
            elif len(fds) != 4:
                raise ValueError("a command comes with its streams and working folder")
            else:
                self._fork(conn, message, fds)
                fds = []
        except (OSError, ValueError):
            pass
        finally:
            for fd in fds:
                os.close(fd)
            if conn.fileno() >= 0 and not any(c[0] is conn for c in self.children.values()):
                conn.close()

    def _fork(self, conn: socket.socket, message: dict, fds: list[int]) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        cpu = time.process_time()
        pid = os.fork()
        if pid == 0:
            self._become(conn, message, fds)  # never returns
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        conn.setblocking(False)
        self.children[pid] = (conn, pidfd, time.process_time() - cpu)
        self.selector.register(pidfd, selectors.EVENT_READ, lambda _: self._ended(pid))
        self.selector.register(conn, selectors.EVENT_READ, lambda _: self._gone(pid))

    def _ended(self, pid: int) -> None:
        conn, pidfd, forking_s = self.children.pop(pid)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        with contextlib.suppress(KeyError, ValueError):  # not when its client went first
            self.selector.unregister(conn)
        _, status, usage = os.wait4(pid, 0)
        self.last = time.monotonic()
        ended = {
            "exit": os.waitstatus_to_exitcode(status),
            "cpu_s": usage.ru_utime + usage.ru_stime + forking_s,  # and its waited-for children
            "maxrss_kb": usage.ru_maxrss,
        }
        with contextlib.suppress(OSError):
            conn.setblocking(True)
            conn.settimeout(5.0)
            send_message(conn, ended)
        conn.close()

    def _gone(self, pid: int) -> None:
        """The client sent more, or went away: only the latter happens; its command goes too."""
        conn = self.children[pid][0]
        try:
            more = conn.recv(1)
        except BlockingIOError:
            return
        except OSError:
            more = b""
        if not more:
            self.selector.unregister(conn)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _become(self, conn: socket.socket, message: dict, fds: list[int]) -> None:
        """The child: set up as the client's command, tell it so, run the command, end."""
        code = 1
        try:
            os.setsid()
            for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.set_wakeup_fd(-1)
            for fd in self.wake:
                os.close(fd)
            self.selector.close()
            self.listener.close()
            os.close(self.lock_fd)
            for other, pidfd, _ in self.children.values():
                other.close()
                os.close(pidfd)
            for target, fd in enumerate(fds[:3]):
                os.dup2(fd, target)
            os.fchdir(fds[3])
            for fd in fds:
                os.close(fd)
            os.umask(message["umask"])
            os.environ.clear()
            os.environ.update(message["env"])
            sys.argv = message["argv"]
            _standard_streams(message["streams"])
            conn.setblocking(True)
            send_message(conn, {"pid": os.getpid()})
            conn.close()
            from bridge.cli import run

            run()  # ends the process (os._exit) when main() returns
        except SystemExit as exc:
            code = exit_code(exc)
        except BaseException:  # noqa: BLE001  # as the interpreter would: the trace, then 1
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 65536, 8)
    if not data:
        raise ValueError("nothing sent")
    buffer = bytearray(data)
    try:
        message = read_message(conn, buffer)
        if message is None or buffer:
            raise ValueError("a malformed request")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return message, fds


def _standard_streams(streams: list[list[str]]) -> None:
    """The client's stdin, stdout and stderr as its interpreter made them: its encodings and
    error handlers, stdout line-buffered on a terminal, stderr always."""
    for index, (encoding, errors) in enumerate(streams):
        stream = io.TextIOWrapper(
            io.open(index, "rb" if index == 0 else "wb", closefd=False),  # noqa: UP020
            encoding=encoding,
            errors=errors,
            newline=None if index == 0 else "\n",
            line_buffering=index == 2 or (index == 1 and os.isatty(1)),
        )
        setattr(sys, ("stdin", "stdout", "stderr")[index], stream)
        setattr(sys, ("__stdin__", "__stdout__", "__stderr__")[index], stream)


def main(argv: list[str]) -> int:
    base, name = argv
    lock_fd = _lock(base, name)
    if lock_fd is None:
        return 0  # another one serves, or the folder is not private
    log = os.open(os.path.join(base, name + ".log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 2)  # its own errors, for whoever looks; each child's go to its client
    os.close(log)
    try:
        preload()
        if threading.active_count() != 1:
            return 1  # a fork of a process with threads is not safe
        idle = float(os.environ.get("WORKER_BRIDGE_WARM_IDLE_S", IDLE_S))
        Server(base, name, lock_fd, idle).serve()
    finally:
        os.close(lock_fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
