"""Processes by pid: starting one in a network namespace (`nsenter --net=`, never `ip netns
exec`, which remounts /sys and hides the cgroup v1 hierarchy from dockerd) as the leader of a
session of its own; telling whether a recorded pid is still the process we started (its start
time); finding every process of ours (recorded, in our namespaces, in our cgroups, or a
descendant of one of those); and stopping them, TERM then KILL, each by its pid. Nothing here
matches a process by its name."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from local_cluster.layout import netns_path
from local_cluster.state import Proc

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from its third field on (the command name may hold spaces)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of the whole line


def is_running(proc: Proc) -> bool:
    """The recorded process still runs (not a zombie, and its pid not reused)."""
    fields = _stat_fields(proc.pid)
    return fields is not None and int(fields[19]) == proc.start and fields[0] != "Z"


def spawn(
    role: str,
    argv: list[str],
    log: Path,
    *,
    netns: str | None = None,
    node: str | None = None,
    env: dict[str, str] | None = None,
) -> Proc:
    """Start ``argv`` detached (a session of its own, so its group can be signalled whole),
    inside ``netns`` when given, its output appended to ``log``."""
    command = ["nsenter", f"--net={netns_path(netns)}", "--", *argv] if netns else argv
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
    started = start_time(child.pid)
    if started is None:  # it ended already: its status tells why, its log says more
        child.wait()
        raise RuntimeError(f"{role} exited at once ({child.returncode}); see {log}")
    # Not waited for: it outlives this process (the kernel reaps it once init adopts it).
    child.returncode = 0  # keeps Popen's finalizer from warning about a running child
    return Proc(role=role, pid=child.pid, start=started, log=str(log), node=node, netns=netns)


def log_tail(proc: Proc, lines: int = 15) -> str:
    try:
        text = Path(proc.log).read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# -- finding ours -----------------------------------------------------------------------------


def _pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


def _parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _group(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def netns_inode(name: str) -> int | None:
    try:
        return os.stat(netns_path(name)).st_ino
    except FileNotFoundError:
        return None


def in_namespaces(names: Iterable[str]) -> set[int]:
    """Every process whose network namespace is one of ``names``."""
    inodes = {i for i in (netns_inode(n) for n in names) if i is not None}
    found = set()
    if not inodes:
        return found
    for pid in _pids():
        try:
            if os.stat(PROC / str(pid) / "ns" / "net").st_ino in inodes:
                found.add(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def cgroup_mounts() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, named ones, the unified one)."""
    found = []
    for line in (PROC / "self" / "mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] in ("cgroup", "cgroup2"):
            found.append(Path(left.split()[4]))
    return found


def in_cgroups(parents: Iterable[str]) -> set[int]:
    """Every process in a cgroup under one of ``parents``, in any hierarchy."""
    found: set[int] = set()
    for mount in cgroup_mounts():
        for parent in parents:
            for procs in (mount / parent).rglob("cgroup.procs"):
                try:
                    found.update(int(x) for x in procs.read_text().split())
                except (FileNotFoundError, OSError):
                    continue
    return found


def in_groups(leaders: Iterable[Proc]) -> set[int]:
    """Every process in the process group of a recorded leader that still runs."""
    groups = {p.pid for p in leaders if is_running(p)}
    return {pid for pid in _pids() if _group(pid) in groups} if groups else set()


def with_descendants(roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in _pids():
        parent = _parent(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


# -- stopping ---------------------------------------------------------------------------------


def signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue


def alive(pids: Iterable[int]) -> set[int]:
    """Those of ``pids`` that still run (a zombie has ended: its parent reaps it)."""
    found = set()
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None and fields[0] != "Z":
            found.add(pid)
    return found


def wait_gone(pids: Iterable[int], timeout_s: float) -> set[int]:
    """Wait until none of ``pids`` runs, at most ``timeout_s``; those still running."""
    left = alive(pids)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = alive(left)
    return left


def stop(pids: set[int], *, grace_s: float) -> set[int]:
    """TERM, then KILL what is still running after ``grace_s``; what would not die."""
    if grace_s > 0:
        signal_all(pids, signal.SIGTERM)
        pids = wait_gone(pids, grace_s)
    signal_all(pids, signal.SIGKILL)
    return wait_gone(pids, 10)


def described(pids: Iterable[int]) -> str:
    """Each of ``pids`` as `pid (name) state: command line`, for a message about them."""
    shown = []
    for pid in sorted(pids):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            shown.append(f"{pid} (gone)")
            continue
        name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
        shown.append(f"{pid} ({name}) {state}: {command.decode(errors='replace')[:200]}")
    return "; ".join(shown)
