"""`scripts/local-cluster down` after an `up` that was killed half way (SIGKILL, so nothing of
its own clean-up ran) leaves nothing behind: the daemons it had started, by their recorded
pids, their namespaces, mounts, cgroup folders and scratch folder. `down` of a cluster that
does not exist, or twice, is no error; `up` refuses a name whose remains are still there.
Engines only (no Ray, no registry): the half-made state is what matters here."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest
from support.cluster import SCRIPT, VENV, LocalCluster, leftovers, process_tree, require_cluster

pytestmark = [pytest.mark.docker, pytest.mark.cluster]


def _recorded(cluster: LocalCluster, role: str) -> list[dict]:
    try:
        state = json.loads((cluster.scratch / "state.json").read_text())
    except (FileNotFoundError, ValueError):  # not written yet, or being replaced
        return []
    return [p for p in state["processes"] if p["role"] == role]


def test_down_after_an_up_killed_half_way_leaves_nothing_and_may_run_twice():
    require_cluster()
    cluster = LocalCluster(f"wbh{secrets.token_hex(3)}")
    cluster.down()  # nothing there yet: no error
    argv = [sys.executable, str(SCRIPT), "--name", cluster.name]
    argv += ["--scratch-root", str(cluster.scratch_root), "--venv", str(VENV)]
    up = subprocess.Popen(
        [*argv, "up", "3", "--no-ray", "--no-registry", "--owner-pid", str(os.getpid())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not _recorded(cluster, "dockerd") and up.poll() is None:
            assert time.monotonic() < deadline, "up recorded no dockerd within 60 s"
            time.sleep(0.01)
        os.kill(up.pid, signal.SIGKILL)  # ours: the `up` this test started
        up.wait(timeout=10)
        state = cluster.state()
        assert state["ready"] is False, "killed before it finished"
        assert _recorded(cluster, "dockerd") and state["nodes"]
        tree = [q for p in state["processes"] for q in process_tree(p["pid"])]
        refused = cluster.script("up", "1", "--no-ray", "--no-registry", check=False)
        assert refused.returncode == 1 and "exists already" in refused.stderr
    finally:
        if up.poll() is None:
            os.kill(up.pid, signal.SIGKILL)
            up.wait(timeout=10)
        cluster.down()
    left = leftovers(cluster, state["processes"], tree)
    assert left == {k: [] for k in left}, left
    cluster.down()
