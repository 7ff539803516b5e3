"""Taking a cluster (or one node) down so that nothing is left: its processes stopped by pid
(recorded ones, with their process groups; whatever runs in its namespaces or its cgroups, or
names its scratch folder; and their descendants), the mounts its daemons left under the
scratch folder, the shims' sockets, its cgroup folders in every hierarchy (depth-first), its
namespaces, and the scratch folder itself. Each step works from what it finds on the machine
as well as from the state file, so it also cleans up after a half-made `up` or a killed one,
and running it twice is harmless."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from local_cluster import network, procs
from local_cluster.layout import NETNS_DIR, ClusterLayout
from local_cluster.state import State

SHIM_SOCKETS = Path("/run/containerd/s")
GRACE_S = 5  # a daemon's time to stop on TERM before it is KILLed


def _ancestors() -> set[int]:
    """This process and those above it: never ours to stop (`local-cluster run -- ... down`)."""
    found, pid = set(), os.getpid()
    while pid > 1:
        found.add(pid)
        fields = (procs.PROC / str(pid) / "stat").read_text()
        pid = int(fields[fields.rindex(")") + 2 :].split()[1])
    return found


def _naming(folder: Path) -> set[int]:
    """Processes whose command line names a path under ``folder``."""
    needle = os.fsencode(str(folder)) + b"/"
    found = set()
    for entry in procs.PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def namespaces(layout: ClusterLayout) -> list[str]:
    """The cluster's namespaces that exist, nodes and control first, the hub last."""
    pattern = re.compile(rf"^{re.escape(layout.name)}-(n[0-9]+|ctl|hub)$")
    found = sorted(p.name for p in NETNS_DIR.glob(f"{layout.name}-*") if pattern.match(p.name))
    return sorted(found, key=lambda n: n.endswith("-hub"))


def is_cgroup_parent(layout: ClusterLayout, folder: str, node: str | None = None) -> bool:
    """``folder`` is the cgroup parent of one of the cluster's nodes (of ``node`` when given):
    never another cluster's, even one whose name begins as this one's (`wbc` and `wbc-n1`)."""
    wanted = re.escape(node) if node else "n[1-9][0-9]*"
    return re.fullmatch(rf"wbc-{re.escape(layout.name)}-{wanted}", folder) is not None


def cgroup_parents(layout: ClusterLayout, node: str | None = None) -> list[Path]:
    """The cgroup folders of the cluster's engines (one node's when ``node``), every hierarchy."""
    found = []
    for mount in procs.cgroup_mounts():
        for path in mount.glob(f"wbc-{layout.name}-n*"):
            if path.is_dir() and is_cgroup_parent(layout, path.name, node):
                found.append(path)
    return found


def processes(layout: ClusterLayout, state: State | None, node: str | None = None) -> set[int]:
    """Every running process of the cluster, or of one of its nodes."""
    recorded = (state.of_node(node) if node else state.processes) if state else []
    names = [f"{layout.name}-{node}"] if node else namespaces(layout)
    parents = [p.name for p in cgroup_parents(layout, node)]
    roots = {p.pid for p in recorded if procs.is_running(p)}
    roots |= procs.in_groups(recorded)
    roots |= procs.in_namespaces(names)
    roots |= procs.in_cgroups(parents)
    roots |= _naming(layout.scratch / node if node else layout.scratch)
    return procs.with_descendants(roots) - _ancestors()


def stop_processes(layout: ClusterLayout, state: State | None, node: str | None = None) -> set[int]:
    """Stop every process of the cluster (or of one node), found again until none is left
    (bounded); what could not be stopped. Containers' processes and Ray's are KILLed at once:
    nothing of theirs outlives the cluster, and Ray's raylets and GCS take over 10 s to honour a
    TERM whose peers are going too. The daemons get a TERM and a short grace."""
    for _ in range(5):
        found = processes(layout, state, node)
        if not found:
            return set()
        recorded = (state.of_node(node) if node else state.processes) if state else []
        ray = procs.in_groups(p for p in recorded if p.role in ("ray", "ray-head"))
        in_containers = procs.in_cgroups(p.name for p in cgroup_parents(layout, node))
        disposable = procs.with_descendants(ray | in_containers) & found
        procs.signal_all(disposable, signal.SIGKILL)
        left = procs.stop(found - disposable, grace_s=GRACE_S) | procs.wait_gone(disposable, 10)
        if left:
            return left
    return processes(layout, state, node)


def kill_processes(layout: ClusterLayout, state: State | None, node: str) -> set[int]:
    """A node's crash: every process of it KILLed at once, nothing shut down cleanly; what
    would not die. Found again after each round: a process started meanwhile (a shim's) goes
    too. A zombie has ended: a shim's short-lived first process whose containerd was just
    killed stays one, as pid 1 here reaps nobody."""
    for _ in range(3):
        found = procs.alive(processes(layout, state, node))
        if not found:
            return set()
        procs.signal_all(found, signal.SIGKILL)
        left = procs.wait_gone(found, 10)
        if left:
            return left
    return procs.alive(processes(layout, state, node))


def mounts_under(folder: Path) -> list[Path]:
    """Mount points at or under ``folder``, deepest first."""
    prefix = str(folder).rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(folder) or point.startswith(prefix):
            found.append(Path(point))
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def unmount_under(folder: Path) -> list[Path]:
    """Unmount everything at or under ``folder`` (lazily when busy); what is still mounted."""
    for _ in range(3):
        points = mounts_under(folder)
        if not points:
            return []
        for point in points:
            done = subprocess.run(["umount", str(point)], capture_output=True)
            if done.returncode != 0:
                subprocess.run(["umount", "--lazy", str(point)], capture_output=True)
    return mounts_under(folder)


def remove_shim_sockets(node_homes: list[Path]) -> int:
    """The sockets of the shims of these nodes' containerds (a shim killed with its node leaves
    its socket in containerd's fixed folder; each container's bundle has an `address` file
    naming it)."""
    removed = 0
    bundles = "containerd/state/io.containerd.runtime.v2.task/*/*/address"
    for address in (a for home in node_homes for a in home.glob(bundles)):
        try:
            target = Path(address.read_text().strip().removeprefix("unix://"))
        except OSError:
            continue
        if target.parent == SHIM_SOCKETS and target.exists():
            target.unlink(missing_ok=True)
            removed += 1
    return removed


def remove_cgroups(paths: list[Path], timeout_s: float = 10) -> list[Path]:
    """rmdir each folder depth-first; a folder still busy (a process leaving) is tried again
    until ``timeout_s``; the folders left."""
    deadline = time.monotonic() + timeout_s
    left = list(paths)
    while left:
        still = []
        for top in left:
            folders = sorted(
                (p for p in top.rglob("*") if p.is_dir()),
                key=lambda p: len(p.parts),
                reverse=True,
            )
            for folder in [*folders, top]:
                try:
                    folder.rmdir()
                except FileNotFoundError:
                    continue
                except OSError:
                    still.append(top)
                    break
        left = still
        if left and time.monotonic() > deadline:
            return left
        if left:
            time.sleep(0.1)
    return []


def remove_scratch(folder: Path) -> None:
    """Remove the scratch folder, never crossing into a file system mounted under it."""
    if not folder.exists():
        return
    if mounts_under(folder):
        raise RuntimeError(f"still mounted under {folder}: {mounts_under(folder)[:3]}")
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(folder)], check=True)
    if folder.exists():
        shutil.rmtree(folder)


def down(layout: ClusterLayout, state: State | None) -> list[str]:
    """Take the whole cluster down; what could not be removed (empty: nothing is left)."""
    problems = []
    left = stop_processes(layout, state)
    if left:
        problems.append(f"processes that would not stop: {sorted(left)}")
    still = unmount_under(layout.scratch)
    if still:
        problems.append(f"mounts left: {[str(p) for p in still]}")
    remove_shim_sockets([p for p in layout.scratch.glob("n*") if p.is_dir()])
    busy = remove_cgroups(cgroup_parents(layout))
    if busy:
        problems.append(f"cgroup folders left: {[str(p) for p in busy]}")
    for name in namespaces(layout):
        try:
            network.delete_namespace(name)
        except RuntimeError as exc:
            problems.append(str(exc))
    if not problems:
        remove_scratch(layout.scratch)
    return problems


def clean_node(layout: ClusterLayout, state: State, node: str) -> None:
    """What a killed node left that would get in the way of starting it again: its mounts,
    its shims' sockets, its (empty) cgroup folders and its engine's pidfile; its data root and
    images are kept."""
    home = layout.scratch / node
    if unmount_under(home):
        raise RuntimeError(f"{node}: mounts under {home} would not go")
    remove_shim_sockets([home])
    busy = remove_cgroups(cgroup_parents(layout, node))
    if busy:
        raise RuntimeError(f"{node}: cgroup folders still in use: {busy}")
    # dockerd refuses to start while its pidfile names a live pid, and a killed dockerd that no
    # one reaped (pid 1 here does not) is a zombie kill(2) still finds: the file goes.
    (home / "docker" / "dockerd.pid").unlink(missing_ok=True)
