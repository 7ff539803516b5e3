"""The warm process (`python -m bridge.warm.server FOLDER NAME`): load the CLI and everything
its commands import, then fork one child per command handed over on FOLDER/NAME.sock
(bridge/warm/client.py). The child becomes the command: a session of its own, the client's
working folder, umask, resource limits, priority, ignored signals, environment, argument list
and standard streams, then the CLI's own `main()` and `finish()`. The parent only forks,
reports each child's exit status and resource usage to its client, and kills a child whose
client went away unannounced (a client killed outright: a command killed outright ends too).

It serves this user only (a private folder, `SO_PEERCRED`) and only callers in its own security
context (`client.context`), never two at once per name (a lock, held until it stops taking
commands), and never from stale code: a command arriving after any loaded `bridge` file, or the
distributions installed on `sys.path`, changed is refused (the client runs it itself) and the
process stops. It stops after IDLE_S without a command (`WORKER_BRIDGE_WARM_IDLE_S`), on
SIGTERM or a stop request: it takes no more commands at once, lets another start, and ends
once its running children have."""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import io
import os
import pkgutil
import resource
import selectors
import signal
import socket
import sys
import threading
import time
import traceback

from bridge.warm.client import context, peer, private, read_message, send_message

IDLE_S = 900.0
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
HANDLED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT)


def open_folder(base: str) -> int | None:
    """``base`` (made if missing) opened without following a link, if it is this user's folder
    that no one else may enter; every file of the warm process is then reached through it."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o700)
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    except OSError:
        return None
    if not private(os.fstat(fd)):
        os.close(fd)
        return None
    return fd


# Libraries the package imports inside a function, not at the top, which a command then loads
# on each run: psutil (a task's owner, a lease's check), glob, and sqlite_utils (a new store's
# migrations, with its plugin scan).
DEFERRED = ("psutil", "glob", "sqlite_utils")


def preload() -> None:
    """Import what commands import: every module of the package (its `__main__` modules run
    something, and are left out), so the libraries they use, and those they import later
    (`DEFERRED`); a module that cannot load here (an optional dependency) is left to the
    command that needs it. And the CLI's whole parser, which every command would build."""
    import bridge

    names = [m.name for m in pkgutil.walk_packages(bridge.__path__, "bridge.")]
    for name in (*names, *DEFERRED):
        if name.rsplit(".", 1)[-1] in ("__main__", "sitecustomize"):
            continue
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    from bridge.cli import prebuild

    prebuild()


_INSTALLED = (".dist-info", ".egg-info", ".egg-link", ".pth")


def loaded_files() -> list[str]:
    """The files of the loaded `bridge` modules (and of `__main__`): what `stamp` watches. The
    modules do not change once loaded, so this is listed once, not per command."""
    return [
        path
        for module in list(sys.modules.values())
        if (path := getattr(module, "__file__", None))
        and (module.__name__ in ("bridge", "__main__") or module.__name__.startswith("bridge."))
    ]


def stamp(files: list[str]) -> dict[str, object]:
    """The loaded code's state: each of ``files`` by modification time and size, and the
    distributions installed in each `sys.path` folder by name (an install, an upgrade or a
    removal changes them; a build log beside an editable checkout does not)."""
    found: dict[str, object] = {}
    for path in files:
        with contextlib.suppress(OSError):
            st = os.stat(path)
            found[path] = (st.st_mtime_ns, st.st_size)
    for folder in sys.path:
        with contextlib.suppress(OSError):
            found[folder] = sorted(n for n in os.listdir(folder or ".") if n.endswith(_INSTALLED))
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
    def __init__(self, folder_fd: int, name: str, lock_fd: int, idle_s: float) -> None:
        self.folder_fd, self.name, self.lock_fd, self.idle_s = folder_fd, name, lock_fd, idle_s
        self.selector = selectors.DefaultSelector()
        # pid: (its client, its pidfd, this process's CPU time spent forking it)
        self.children: dict[int, tuple[socket.socket, int, float]] = {}
        self.stopping = False
        self.context = context()
        # Bound under a name of its own until loaded, then published: a client never waits for
        # a warm process that is still loading, and a socket that cannot be bound (a path too
        # long) fails before the load.
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.inode: int | None = None  # its socket's, once bound: removed only if its own
        self._unlink(f"{name}.new")
        mask = os.umask(0o177)
        try:
            self.listener.bind(f"/proc/self/fd/{folder_fd}/{name}.new")
        finally:
            os.umask(mask)
        self.inode = os.stat(f"{name}.new", dir_fd=folder_fd).st_ino

    def publish(self, loaded_since_ns: int) -> None:
        self.files = loaded_files()
        self.loaded = stamp(self.files)
        # a file that changed while it loaded may be half old: the first command is refused (a
        # file dated in the future, as an archive may leave it, did not change while it loaded)
        now = time.time_ns()
        self.fresh = not any(
            loaded_since_ns <= v[0] <= now for v in self.loaded.values() if isinstance(v, tuple)
        )
        self.listener.listen(64)
        os.rename(
            f"{self.name}.new",
            f"{self.name}.sock",
            src_dir_fd=self.folder_fd,
            dst_dir_fd=self.folder_fd,
        )
        self.selector.register(self.listener, selectors.EVENT_READ, self._accept)
        self.last = time.monotonic()

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
        """Take no more commands: the socket goes (if it is still its own) and the lock is let
        go, so another warm process may start; the children that run still have their status
        reported."""
        if self.stopping:
            return
        self.stopping = True
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        self._unlink(f"{self.name}.sock")
        self._unlink(f"{self.name}.new")
        self.listener.close()
        os.close(self.lock_fd)

    def _stale(self) -> bool:
        """Whether its code may differ from what is installed now (or a thread appeared)."""
        return not self.fresh or stamp(self.files) != self.loaded or threading.active_count() != 1

    def _unlink(self, entry: str) -> None:
        with contextlib.suppress(OSError):
            found = os.stat(entry, dir_fd=self.folder_fd, follow_symlinks=False)
            if self.inode is None or found.st_ino == self.inode:
                os.unlink(entry, dir_fd=self.folder_fd)

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        self.last = time.monotonic()
        fds: list[int] = []
        try:
            conn.settimeout(5.0)  # a client that connects and sends nothing holds no one up
            pid, uid = peer(conn)
            if uid != os.getuid() or context(pid) != self.context:
                raise OSError("another user, or a caller confined otherwise than this process")
            message, fds = _receive(conn)
            if message.get("stop"):
                self.stop()
                send_message(conn, {"stopping": True})
            elif message.get("status"):
                send_message(conn, {"server": os.getpid(), "children": sorted(self.children)})
            elif self._stale():
                self.stop()
                send_message(conn, {"refused": "the installed code changed since it loaded"})
            elif len(fds) == 4:
                owned, fds = fds, []
                self._fork(conn, message, owned)
        except (OSError, ValueError):
            pass
        finally:
            for fd in fds:
                os.close(fd)
            if not any(c[0] is conn for c in self.children.values()):
                conn.close()

    def _fork(self, conn: socket.socket, message: dict, fds: list[int]) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        cpu = time.process_time()
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)  # none handled as this process's
        try:
            pid = os.fork()
            if pid == 0:
                self._become(conn, message, fds)  # never returns
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
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
        if pid not in self.children:
            return  # ended in the same round
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
        """The child: set up as the client's command, tell it so, run the command, end. What
        can fail is done while its errors still go to the warm process's log: the client then
        runs the command itself."""
        try:
            os.setsid()
            signal.set_wakeup_fd(-1)
            for signum in HANDLED:
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for signum in message["ignored"]:
                signal.signal(signum, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
            for fd in (*self.wake, self.folder_fd, self.lock_fd):
                os.close(fd)
            self.selector.close()
            self.listener.close()
            for other, pidfd, _ in self.children.values():
                other.close()
                os.close(pidfd)
            os.fchdir(fds[3])
            os.umask(message["umask"])
            for limit, soft, hard in message["limits"]:
                if resource.getrlimit(limit) != (soft, hard):
                    resource.setrlimit(limit, (soft, hard))
            os.setpriority(os.PRIO_PROCESS, 0, message["nice"])
            os.environ.clear()
            os.environ.update(message["env"])
            sys.argv = message["argv"]
            for target, fd in enumerate(fds[:3]):
                os.dup2(fd, target)
            for fd in fds:
                os.close(fd)
            _standard_streams(message["streams"])
            conn.setblocking(True)
            send_message(conn, {"pid": os.getpid()})
            conn.close()
        except BaseException:  # noqa: BLE001  # not started: the client runs it
            traceback.print_exc()
            os._exit(1)
        from bridge.cli import finish, main

        code, signum = 1, None
        try:
            code = main()
        except SystemExit as exc:
            code = exit_code(exc)
        except KeyboardInterrupt:
            signum = signal.SIGINT  # as the interpreter ends on one: killed by it
        except BaseException:  # noqa: BLE001  # as the interpreter would: the trace, then 1
            traceback.print_exc()
        finish(code, signum)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 65536, 8)
    try:
        buffer = bytearray(data)
        message = read_message(conn, buffer) if data else None
        if message is None or buffer:
            raise ValueError("a malformed request")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return message, fds


def _standard_streams(streams: list[list]) -> None:
    """The client's stdin, stdout and stderr as its interpreter made them (their encodings,
    error handlers, line buffering and writing through, which depend on its flags, its
    environment and whether each is a terminal), without newline translation, as CPython's."""
    for index, (encoding, errors, line_buffering, write_through) in enumerate(streams):
        stream = io.TextIOWrapper(
            io.open(index, "rb" if index == 0 else "wb", closefd=False),  # noqa: UP020
            encoding=encoding,
            errors=errors,
            newline="\n",
            line_buffering=line_buffering,
            write_through=write_through,
        )
        setattr(sys, ("stdin", "stdout", "stderr")[index], stream)
        setattr(sys, ("__stdin__", "__stdout__", "__stderr__")[index], stream)


def main(argv: list[str]) -> int:
    base, name = argv
    folder_fd = open_folder(base)
    if folder_fd is None:
        return 0  # not a private folder: never used
    lock_fd = os.open(f"{name}.lock", os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600, dir_fd=folder_fd)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another one serves
    log = os.open(
        f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o600, dir_fd=folder_fd
    )
    os.dup2(log, 2)  # its own errors, for whoever looks; each child's go to its client
    os.close(log)
    os.close(os.pidfd_open(os.getpid()))  # without pidfds (before Linux 5.3) it cannot serve
    server = Server(
        folder_fd, name, lock_fd, float(os.environ.get("WORKER_BRIDGE_WARM_IDLE_S", IDLE_S))
    )
    loading_since = time.time_ns()
    preload()
    if threading.active_count() != 1:
        server.stop()
        return 1  # a fork of a process with threads is not safe
    server.publish(loading_since)
    server.serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
