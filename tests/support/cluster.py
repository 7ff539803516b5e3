"""The simulated cluster the cluster tests stand on (scripts/local-cluster): `local_cluster`
brings two nodes up once per test session (the engines, the registry, a Ray head and a Ray node
per node), again for a test when one before took them down, and takes them down at the end,
also after a failure; a session killed before its end is reaped by the next one (the cluster
records the pytest process as its owner). Whether
the cluster can run here at all is asked once: without root, the daemons, the registry or Ray
its tests are skipped, or failed under WORKER_BRIDGE_REQUIRE_CLUSTER=1 (CI sets it).

`leftovers` lists what a cluster left on the machine after `down`: its processes, namespaces,
mounts, cgroup folders and scratch folder."""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-cluster"
# On /dev/shm when present: removing a node's data root (an unpacked image, thousands of files)
# took 15-25 s on the loaded root disk here, 0.4 s on tmpfs; the nodes' overlay2 works on it.
SCRATCH_ROOT = Path("/dev/shm/wbc") if Path("/dev/shm").is_dir() else Path("/var/tmp/wbc")
VENV = Path(sys.prefix)  # where the tests run from: Ray is installed there (the `cluster` extra)
REQUIRE_CLUSTER = os.environ.get("WORKER_BRIDGE_REQUIRE_CLUSTER") == "1"
NODES = 3
DRIVER_MARK = "WB-DRIVER-RESULT "  # a driver's answer follows it (tests/cluster/ray_driver.py)
TOOLS = ["ip", "nsenter", "containerd", "dockerd", "umount", "socat", "docker-registry"]


@functools.cache
def cluster_unavailable() -> str | None:
    """Why a local cluster cannot run here (None: it can), asked once per test process."""
    if os.geteuid() != 0:
        return "the local cluster needs root (namespaces, daemons, cgroups)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (`make test-deps` installs them)"
    if not (VENV / "bin" / "ray").exists():
        return f"no Ray in {VENV} (`make install` installs the `cluster` extra)"
    return None


def require_cluster() -> None:
    why = cluster_unavailable()
    if why is None:
        return
    if REQUIRE_CLUSTER:
        pytest.fail(f"WORKER_BRIDGE_REQUIRE_CLUSTER=1 but: {why}")
    pytest.skip(why)


@dataclass(frozen=True)
class Node:
    name: str
    netns: str
    ip: str
    docker_host: str
    cgroup_parent: str
    resource: str

    def sandbox(self):
        """worker-bridge's unchanged `DockerSandbox`, on this node's engine."""
        import docker

        from bridge.sandbox import DockerSandbox

        return DockerSandbox(docker.DockerClient(base_url=self.docker_host, timeout=120))


class LocalCluster:
    """One cluster made by scripts/local-cluster, driven through the script itself."""

    def __init__(self, name: str, scratch_root: Path = SCRATCH_ROOT) -> None:
        self.name = name
        self.scratch_root = scratch_root
        self.scratch = scratch_root / name

    def script(self, *args: str, timeout: float = 240, check: bool = True, env: dict | None = None):
        argv = [sys.executable, str(SCRIPT), "--name", self.name]
        argv += ["--scratch-root", str(self.scratch_root), "--venv", str(VENV), *args]
        environ = {**os.environ, **(env or {})}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=environ)
        if check and done.returncode != 0:
            raise AssertionError(
                f"local-cluster {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
            )
        return done

    def up(self, count: int = NODES, *options: str) -> str:
        done = self.script("up", str(count), "--owner-pid", str(os.getpid()), *options)
        return done.stdout.strip()

    def down(self) -> None:
        self.script("down", timeout=180)

    def is_up(self) -> bool:
        try:
            return bool(self.state().get("ready"))
        except (FileNotFoundError, ValueError):
            return False

    def state(self) -> dict:
        return json.loads((self.scratch / "state.json").read_text())

    def status(self) -> dict:
        return json.loads(self.script("status", "--json", timeout=60).stdout)

    @property
    def nodes(self) -> list[Node]:
        fields = Node.__dataclass_fields__
        return [Node(**{k: v for k, v in n.items() if k in fields}) for n in self.state()["nodes"]]

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def run_driver(
        self, script: Path, *args: str, timeout: float = 120, env: dict | None = None
    ) -> dict:
        """Run ``script`` with the tests' Python as the control host (in the control namespace,
        with RAY_ADDRESS and the token's file set, and ``env``); the JSON it printed after
        DRIVER_MARK."""
        argv = ["run", "--", sys.executable, str(script), *args]
        done = self.script(*argv, timeout=timeout, env=env)
        if DRIVER_MARK not in done.stdout:
            raise AssertionError(f"no answer from {script.name}:\n{done.stdout[-2000:]}")
        return json.loads(done.stdout.rpartition(DRIVER_MARK)[2].splitlines()[0])


def reap_orphans() -> None:
    """Take down the clusters of test sessions that ended without doing it (killed)."""
    if SCRATCH_ROOT.is_dir():
        LocalCluster("reaper").script("reap", timeout=180, check=False)  # the name is unused


@pytest.fixture(scope="session")
def session_cluster() -> Iterator[LocalCluster]:
    """Three simulated nodes with Ray and the registry, for the whole session."""
    require_cluster()
    reap_orphans()
    cluster = LocalCluster(f"wbt{secrets.token_hex(3)}")
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def local_cluster(session_cluster: LocalCluster) -> LocalCluster:
    """The session's cluster, up: brought up again when a test before took it down (the test
    of `down` does; under xdist its module may run before another's on the same worker)."""
    if not session_cluster.is_up():
        session_cluster.up()
    return session_cluster


# -- what a cluster may leave behind -----------------------------------------------------------


def _cgroup_mounts() -> list[Path]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] in ("cgroup", "cgroup2"):
            found.append(Path(left.split()[4]))
    return found


def _mounts_under(folder: Path) -> list[str]:
    prefix = f"{folder}/"
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p == str(folder) or p.startswith(prefix)]


def _alive(pid: int, start: int | None = None) -> bool:
    """``pid`` runs (with the start time ``start`` when given). A zombie has ended: here pid 1
    does not reap the orphans it adopts, so a killed daemon may stay in the table as one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    return (start is None or int(fields[19]) == start) and fields[0] != "Z"


def running(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (not ended, not a zombie)."""
    return [pid for pid in pids if _alive(pid)]


def _naming(folder: Path) -> list[int]:
    needle = os.fsencode(f"{folder}/")
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def leftovers(cluster: LocalCluster, recorded: list[dict], extra_pids: list[int]) -> dict:
    """What is left of ``cluster`` on the machine: the processes it recorded (by pid and start
    time) or that name its scratch folder, ``extra_pids`` still running (containers' processes,
    Ray's workers), its namespaces, mounts under its scratch folder, its cgroup folders in every
    hierarchy, and the folder itself. Empty lists everywhere: nothing is left."""
    cgroups = [
        str(path)
        for mount in _cgroup_mounts()
        for path in mount.glob(f"wbc-{cluster.name}-n*")
        if path.is_dir() and re.fullmatch(rf"wbc-{cluster.name}-n[0-9]+", path.name)
    ]
    return {
        "processes": [p["pid"] for p in recorded if _alive(p["pid"], p["start"])]
        + _naming(cluster.scratch)
        + running(extra_pids),
        "namespaces": sorted(
            p.name
            for p in Path("/run/netns").glob(f"{cluster.name}-*")
            if re.fullmatch(rf"{cluster.name}-(n[0-9]+|ctl|hub)", p.name)
        ),
        "mounts": _mounts_under(cluster.scratch),
        "cgroups": cgroups,
        "scratch": [str(cluster.scratch)] if cluster.scratch.exists() else [],
    }


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def in_netns(netns: str) -> list[int]:
    """The running processes in the network namespace ``netns`` (none once it is deleted)."""
    try:
        inode = os.stat(f"/run/netns/{netns}").st_ino
    except FileNotFoundError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns" / "net").st_ino == inode and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
