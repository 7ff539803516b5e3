"""Removing large folders off the critical path: a folder nothing will use again (a verification
checkout after its command, a worktree after accept) is renamed into `<home>/trash/` at once
and removed there by a background remover, a detached process of its own.

Removing a tree costs a syscall or two per entry, and on a disk that discards freed blocks (the
root disk here is ext4 mounted with `discard` and no journal) each file whose last link goes
costs a synchronous discard: 100,000 small files took 30-60 s to remove, where git's own
checkout of them took 8 s. Renaming into the trash is one `rename`, so the task or the accept
returns as soon as its real work is done; the remover frees the disk a little later.

Only one remover runs per state root (an `flock` on `<home>/locks/trash.lock`, taken by the
process that starts it and inherited by the remover, so a folder put in the trash is never
left behind between a remover's last look and its exit). `workspaces prune --apply` waits for a
running remover and empties whatever a killed one left (`reap`).

What must happen before a folder can go to the trash (an accepted task's worktree is unmounted
first: the kernel drops every file the task wrote, 0.2 s at 100,000) runs in a thread of the
process (`later`), once nothing can use the folder again: the caller answers without waiting.
The thread is not a daemon, so the process waits for it at exit, and `reap` waits for it first;
what a killed process left is the next prune's.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bridge.workspace import fs

# The remover imports only this module and `fs` (the standard library besides): the package's
# own `__init__` pulls in the facade (pydantic, docker-py), about 0.45 s of CPU that the
# remover has no use for, so it is started with a stand-in for the `bridge` package.
_REMOVER = (
    "import sys, types\n"
    "package = types.ModuleType('bridge')\n"
    "package.__path__ = [sys.argv[1]]\n"
    "sys.modules['bridge'] = package\n"
    "from bridge.workspace.trash import remover_main\n"
    "remover_main(int(sys.argv[2]), sys.argv[3])\n"
)
_PACKAGE = Path(__file__).resolve().parents[1]


_LATER: list[threading.Thread] = []  # this process's clean-ups still running (`later`)
_LATER_LOCK = threading.Lock()
_log = logging.getLogger("worker_bridge.trash")


def later(work: Callable[[], object]) -> None:
    """Run ``work``, a finished task's clean-up, in a thread of its own (see the module's doc).
    Nobody waits for its answer: an error is logged (stderr, by default), and what it left is
    the next prune's."""

    def run() -> None:
        try:
            work()
        except Exception:  # noqa: BLE001 - see above
            _log.warning(
                "a clean-up in the background failed; `worker-bridge workspaces prune --apply` "
                "removes what it left",
                exc_info=True,
            )

    thread = threading.Thread(target=run, name="worker-bridge-clean-up")
    with _LATER_LOCK:
        _LATER[:] = [t for t in _LATER if t.is_alive()] + [thread]
    thread.start()


def wait_for_later(timeout: float | None = None) -> None:
    """Wait for the clean-ups this process started (`later`), ``timeout`` seconds for all."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _LATER_LOCK:
        running = list(_LATER)
    for thread in running:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))


def trash_dir(home: Path) -> Path:
    return home / "trash"


def discard(home: Path, path: Path) -> list[str]:
    """Take ``path`` (a folder or file under ``home``) out of the way now and have it removed
    in the background. Where it cannot be renamed into the trash (another filesystem), it is
    removed here and now; returns what could not be removed then (nothing when deferred)."""
    if not os.path.lexists(path):
        return []
    trash = trash_dir(home)
    trash.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = trash / f"{time.time_ns()}-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return []
    except OSError:
        return fs.remove_tree(path)
    start_remover(home)
    return []


def start_remover(home: Path) -> None:
    """Start a background remover for ``home``'s trash unless one is running."""
    fd = _open_lock(home)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # whoever holds it looks at the trash again after letting go
        # The lock goes with the descriptor to the remover: there is no moment at which the
        # trash has entries and nobody holds the lock.
        subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REMOVER, str(_PACKAGE), str(fd), str(home)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(fd,),
            start_new_session=True,
        )
    finally:
        os.close(fd)


def remover_main(fd: int, home_text: str) -> None:
    """The remover process: holds the lock (inherited as ``fd``), empties the trash, and
    exits once nothing is left but what it could not remove, and nothing arrived after it let
    go of the lock."""
    home = Path(home_text)
    _yield_to_others()
    stuck: set[str] = set()
    while True:
        stuck |= _empty(home, stuck)
        fcntl.flock(fd, fcntl.LOCK_UN)
        if not set(_entries(home)) - stuck:
            break
        try:  # an entry arrived meanwhile, and its sender left it to the lock's holder
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            break  # a newer remover holds it
    os.close(fd)


def _yield_to_others() -> None:
    """Run behind the work someone is waiting for: a lower CPU priority, and the idle I/O
    class, so the discards of what it frees wait for the disk to be otherwise idle (honoured
    by the mq-deadline and bfq schedulers; best effort: nothing changes where it is not)."""
    try:
        os.nice(10)
    except OSError:
        pass
    number = _IOPRIO_SET.get(os.uname().machine)
    if number is None:
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).syscall(number, _IOPRIO_WHO_PROCESS, 0, _IOPRIO_IDLE)
    except (OSError, AttributeError):
        pass


_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}  # the ioprio_set syscall's number
_IOPRIO_WHO_PROCESS = 1
_IOPRIO_IDLE = 3 << 13  # IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT


def reap(home: Path, timeout: float = 3600.0) -> list[str]:
    """Empty the trash here and now, after waiting for a running remover; what could not be
    removed, one line each (for `workspaces prune`, and to wait for the trash in tests and
    benchmarks); this process's clean-ups (`later`) are waited for first."""
    deadline = time.monotonic() + timeout
    wait_for_later(timeout)
    if not trash_dir(home).is_dir():
        return []
    fd = _open_lock(home)
    try:
        if not _wait_lock(fd, max(0.0, deadline - time.monotonic())):
            return [f"{trash_dir(home)}: its background remover is still running"]
        failures: list[str] = []
        _empty(home, set(), failures)
    finally:
        os.close(fd)
    if _entries(home) and not failures:
        start_remover(home)  # arrived while we held the lock: their senders left them to us
    return failures


def leftovers(home: Path) -> list[str]:
    """What lies in the trash with no remover at work on it (one was killed, or gave up on
    something): the names, for `workspaces prune` to show."""
    if not _entries(home):
        return []
    fd = _open_lock(home)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return []  # being removed right now
    finally:
        os.close(fd)
    return sorted(_entries(home))


def _open_lock(home: Path) -> int:
    lock = home / "locks" / "trash.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _entries(home: Path) -> list[str]:
    try:
        return os.listdir(trash_dir(home))
    except FileNotFoundError:
        return []


def _empty(home: Path, skip: set[str], failures: list[str] | None = None) -> set[str]:
    """Remove every entry of the trash but ``skip``, until none is left; the names that could
    not be removed (their failures appended to ``failures``)."""
    stuck: set[str] = set()
    while names := sorted(set(_entries(home)) - skip - stuck):
        for name in names:
            failed = fs.remove_tree(trash_dir(home) / name)
            if failed:
                stuck.add(name)
                if failures is not None:
                    failures += failed
    return stuck


def _wait_lock(fd: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
