"""Tasks on the simulated cluster (issue 44), end to end: worker-bridge runs as the control host
in the cluster's control namespace (tests/cluster/bridge_driver.py), its task's worker turn on a
node's own engine through the node's agent (a Ray actor), the snapshot back as a bundle, the
checks here; the diff equals the same task run on this host alone."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest
from support.cluster import DRIVER_MARK, SCRIPT, VENV, in_netns
from support.repos import git
from support.tasks import mock_task
from support.waiting import poll

from bridge import WorkerBridge
from bridge.cluster.images import put_image
from bridge.sandbox import DockerSandbox
from bridge.store import Store

pytestmark = [pytest.mark.docker, pytest.mark.cluster]

DRIVER = Path(__file__).with_name("bridge_driver.py")


def on_cluster(local_cluster, home: Path, spec: dict, workdir: Path, timeout: float = 300) -> dict:
    """The result of ``spec`` run by a control host of the cluster with state root ``home``."""
    path = workdir / f"spec-{len(list(workdir.glob('spec-*')))}.json"
    path.write_text(json.dumps(spec))
    env = {"WORKER_BRIDGE_HOME": str(home), "PYTHONPATH": str(Path(__file__).parents[2])}
    return local_cluster.run_driver(DRIVER, "run", str(path), timeout=timeout, env=env)


def test_a_task_runs_on_a_node_and_its_diff_equals_the_same_task_run_here(
    local_cluster, repo, workdir
):
    spec = mock_task(
        repo,
        {"write": {"new.py": "X = 1\n", "calc.py": "def add(a, b):\n    return a - b\n"}},
        verify=["test -f new.py", "grep -q 'a - b' calc.py"],
    )
    home = workdir / "cluster-home"
    result = on_cluster(local_cluster, home, spec, workdir)
    assert result["status"] == "succeeded", result.get("error")
    nodes = {n.name for n in local_cluster.nodes}
    assert result["worker_node"] in nodes
    assert result["verify_node"] in nodes - {result["worker_node"]}  # the checks elsewhere
    assert result["verification"]["ok"] is True
    # The node's engine ran the worker: its container was there, not on this host's engine.
    events = WorkerBridge(home=home).task_logs(result["task_id"], limit=10_000).events
    placed = [e.data["node"] for e in events if e.kind == "cluster.placed"]
    assert placed == [result["worker_node"]]
    # The node's engine holds the worker's image by the control host's id (pulled by digest).
    image = "worker-bridge/mock:0.1.0"
    node = local_cluster.node(result["worker_node"]).sandbox().inspect_image(image)
    assert node is not None and node.id == DockerSandbox().inspect_image(image).id

    here = WorkerBridge(home=workdir / "local-home")
    try:
        local = here.run_task(here.create_task(spec).task_id)
    finally:
        here.close()
    assert local.status == "succeeded"
    assert (
        Path(result["artifacts"]["diff"]).read_bytes() == Path(local.artifacts["diff"]).read_bytes()
    )
    assert git(repo, "show", f"{result['branch']}:new.py") == "X = 1\n"
    print(f"timings on the cluster {result['timings']}, here {local.timings}", file=sys.stderr)


@contextmanager
def _driving(local_cluster, home: Path, spec: dict, workdir: Path, env: dict | None = None):
    """The driver running ``spec`` in the background, killed on the way out if it still runs."""
    path = workdir / f"spec-{len(list(workdir.glob('spec-*')))}.json"
    path.write_text(json.dumps(spec))
    argv = [sys.executable, str(SCRIPT), "--name", local_cluster.name]
    argv += ["--scratch-root", str(local_cluster.scratch_root), "--venv", str(VENV)]
    argv += ["run", "--", sys.executable, str(DRIVER), "run", str(path)]
    environ = {**os.environ, "WORKER_BRIDGE_HOME": str(home), **(env or {})}
    environ["PYTHONPATH"] = str(Path(__file__).parents[2])
    driver = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ, text=True
    )
    try:
        yield driver
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def _answer(process: subprocess.Popen, timeout: float) -> dict:
    out, err = process.communicate(timeout=timeout)
    assert DRIVER_MARK in out, f"no answer:\n{out[-2000:]}\n{err[-3000:]}"
    return json.loads(out.rpartition(DRIVER_MARK)[2].splitlines()[0])


def _placed(home: Path, timeout: float = 120) -> tuple[str, str]:
    """(task id, node) once the control host at ``home`` placed a task's turn on a node."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (home / "bridge.db").exists():
            store = Store(home / "bridge.db")
            try:
                found = store.query(
                    "SELECT task_id, data FROM events WHERE kind = 'cluster.placed'"
                    " ORDER BY event_id"
                )
            finally:
                store.close()
            if found:
                return found[0]["task_id"], json.loads(found[0]["data"])["node"]
        time.sleep(0.1)
    raise AssertionError("no turn was placed")


def _events(home: Path, task_id: str) -> list:
    bridge = WorkerBridge(home=home)
    try:
        return bridge.task_logs(task_id, limit=10_000).events
    finally:
        bridge.close()


def test_a_node_killed_mid_turn_ends_the_attempt_naming_it_and_the_turn_reruns_on_another(
    local_cluster, repo, workdir
):
    spec = mock_task(
        repo, {"sleep": 6, "write": {"done.txt": "yes\n"}}, verify=["test -f done.txt"]
    )
    home = workdir / "kill-home"
    timeout_s = 8
    with _driving(
        local_cluster,
        home,
        spec,
        workdir,
        {"WORKER_BRIDGE_CLUSTER__NODE_TIMEOUT_S": str(timeout_s)},
    ) as driver:
        task_id, node = _placed(home)
        _wait_for(home, task_id, "worker.started")  # the node's container runs: kill it under it
        killed_at = time.time()
        local_cluster.script("kill", node)
        result = _answer(driver, timeout=240)
    assert result["status"] == "succeeded", result.get("error")
    assert result["worker_node"] != node
    events = _events(home, task_id)
    lost = [e for e in events if e.kind == "cluster.node_lost"]
    assert [e.data["node"] for e in lost] == [node]
    lost_after = datetime.fromisoformat(lost[0].at).timestamp() - killed_at
    assert lost_after <= timeout_s + 5, lost_after
    _no_leases_left(home)
    _comes_back_clean(local_cluster, home, node, task_id)
    print(f"node lost {lost_after:.1f} s after the kill (timeout {timeout_s} s)", file=sys.stderr)


def test_a_node_killed_during_the_checks_is_lost_and_they_run_again_on_a_third(
    local_cluster, repo, workdir
):
    spec = mock_task(repo, {"write": {"done.txt": "yes\n"}}, verify=["sleep 8", "test -f done.txt"])
    spec["metadata"]["auto_repair"] = 0  # no budget: running the checks again must cost none
    home = workdir / "kill-checks-home"
    timeout_s = 8
    env = {"WORKER_BRIDGE_CLUSTER__NODE_TIMEOUT_S": str(timeout_s)}
    with _driving(local_cluster, home, spec, workdir, env) as driver:
        task_id, worker = _placed(home)
        checks = _checks_placed(home, task_id)
        engine = local_cluster.node(checks).sandbox()
        poll(
            lambda: engine.containers({"io.worker-bridge.task": task_id}),
            "the checks' container on its node",
            120,
        )
        killed_at = time.time()
        local_cluster.script("kill", checks)
        result = _answer(driver, timeout=240)
    assert result["status"] == "succeeded", result.get("error")
    assert result["verification"]["ok"] is True
    assert result["worker_node"] == worker
    assert result["verify_node"] not in (checks, worker)  # a third node, not the lost one
    events = _events(home, task_id)
    assert [e.data["node"] for e in events if e.kind == "cluster.placed"] == [worker]  # one turn
    lost = [e for e in events if e.kind == "cluster.node_lost"]
    assert [(e.data["node"], e.data.get("checks")) for e in lost] == [(checks, True)]
    lost_after = datetime.fromisoformat(lost[0].at).timestamp() - killed_at
    assert lost_after <= timeout_s + 5, lost_after
    _no_leases_left(home)
    _comes_back_clean(local_cluster, home, checks, task_id)
    print(f"checks' node lost {lost_after:.1f} s after the kill", file=sys.stderr)


def _checks_placed(home: Path, task_id: str, timeout: float = 120) -> str:
    """The node the control host at ``home`` placed the task's checks on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in _events(home, task_id) if e.kind == "cluster.checks_placed"]
        if found:
            return found[0].data["node"]
        time.sleep(0.1)
    raise AssertionError("no checks were placed")


def _comes_back_clean(local_cluster, home: Path, node: str, task_id: str) -> None:
    """The killed ``node`` started again: its agent, made again, removes what the task left
    there."""
    local_cluster.script("start", node)
    engine = local_cluster.node(node).sandbox()
    env = {"WORKER_BRIDGE_HOME": str(home), "PYTHONPATH": str(Path(__file__).parents[2])}
    reaped = local_cluster.run_driver(DRIVER, "reap", node, env=env, timeout=180)
    assert task_id in reaped["reaped"]
    assert engine.containers({"io.worker-bridge.task": task_id}) == []


def test_a_node_cut_off_mid_turn_is_lost_within_the_timeout_and_its_turn_ends_there(
    local_cluster, repo, workdir
):
    spec = mock_task(repo, {"sleep": 20, "write": {"done.txt": "yes\n"}}, verify=["true"])
    spec["metadata"]["auto_repair"] = 0
    home = workdir / "cut-home"
    timeout_s = 6
    env = {"WORKER_BRIDGE_CLUSTER__NODE_TIMEOUT_S": str(timeout_s)}
    node = None
    try:
        with _driving(local_cluster, home, spec, workdir, env) as driver:
            task_id, node = _placed(home)
            _wait_for(home, task_id, "worker.started")
            engine = local_cluster.node(node).sandbox()
            assert engine.containers({"io.worker-bridge.task": task_id})
            cut_at = time.time()
            local_cluster.script("cut", node)
            result = _answer(driver, timeout=240)
    finally:
        if node is not None:
            local_cluster.script("join", node)
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "node_lost" and node in result["error"]["message"]
    _no_leases_left(home)
    lost = [e for e in _events(home, task_id) if e.kind == "cluster.node_lost"]
    lost_after = datetime.fromisoformat(lost[0].at).timestamp() - cut_at
    assert lost_after <= timeout_s + 5, lost_after
    # Cut off, the node's agent heard from no one: it ended the turn itself and let go of
    # everything of the task there (its container, worktree and shadow).
    shadows = local_cluster.scratch / node / "agent" / "state" / "bridge.db"

    def nothing_left() -> bool:
        store = Store(shadows)
        try:
            rows = store.query("SELECT task_id FROM tasks WHERE task_id = ?", (task_id,))
        finally:
            store.close()
        return not rows and not engine.containers({"io.worker-bridge.task": task_id})

    poll(nothing_left, "the cut node to let go of the task", 60)
    assert not (shadows.parent / "worktrees" / task_id).exists()
    print(
        f"cut node lost {lost_after:.1f} s after the cut (timeout {timeout_s} s)", file=sys.stderr
    )


def test_a_cancel_reaches_the_container_on_its_node(local_cluster, repo, workdir):
    spec = mock_task(repo, {"sleep": 60, "write": {"done.txt": "yes\n"}})
    home = workdir / "cancel-home"
    with _driving(local_cluster, home, spec, workdir) as driver:
        task_id, node = _placed(home)
        _wait_for(home, task_id, "worker.started")
        engine = local_cluster.node(node).sandbox()
        assert engine.containers({"io.worker-bridge.task": task_id})
        bridge = WorkerBridge(home=home)
        try:
            began = time.monotonic()
            bridge.cancel_task(task_id)
        finally:
            bridge.close()
        result = _answer(driver, timeout=120)
        took = time.monotonic() - began
    assert result["status"] == "cancelled"
    assert engine.containers({"io.worker-bridge.task": task_id}) == []
    _no_leases_left(home)
    print(f"cancelled on {node} in {took:.1f} s", file=sys.stderr)


def _no_leases_left(home: Path) -> None:
    """The control host holds no lease of the task any more: no node slot, no repository or
    worker limit (a lost node's slot included)."""
    store = Store(home / "bridge.db")
    try:
        assert store.leases.live() == []
    finally:
        store.close()


def _wait_for(home: Path, task_id: str, kind: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.kind == kind for e in _events(home, task_id)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no {kind} within {timeout} s")


PROBE = r"""python3 - <<'PYEOF'
import json, os, urllib.request
out = {}
req = urllib.request.Request(os.environ["WB_ROUTE_TEST"] + "/v1/messages",
    data=b'{"model": "mock-model"}', method="POST",
    headers={"x-api-key": "placeholder", "content-type": "application/json"})
out["answer"] = json.loads(urllib.request.urlopen(req, timeout=20).read())
mark = bytes.fromhex(os.environ.get("PROBE_MARK_HEX", "") or "%s")
found = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if mark in open(f"/proc/{pid}/environ", "rb").read():
                found.append(f"/proc/{pid}/environ")
        except OSError:
            pass
for top in ("/etc", "/home", "/tmp", "/run", "/var/lib/worker-bridge", "/workspace"):
    for dirpath, _, names in os.walk(top):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                if mark in open(path, "rb").read(1 << 20):
                    found.append(path)
            except OSError:
                pass
out["found"] = found
out["interfaces"] = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
json.dump(out, open("probe.json", "w"), indent=1)
PYEOF"""


def test_a_route_goes_through_the_relay_its_key_never_on_the_node_its_secret_dead_after(
    local_cluster, repo, workdir
):
    key = "sk-cluster-" + secrets.token_hex(16)
    marker = key[11:27].encode()  # in the script only as hex: whole at run time alone
    spec = mock_task(repo, {"routes": ["test"], "script": PROBE % marker.hex()})
    path = workdir / "routed-spec.json"
    path.write_text(json.dumps(spec))
    home = workdir / "routed-home"
    tests = Path(__file__).parents[1]
    env = {
        "WORKER_BRIDGE_HOME": str(home),
        "WB_TEST_ROUTE_KEY": key,
        "PYTHONPATH": f"{tests.parent}:{tests}",
        "WB_TEST_NETNS": json.dumps({n.name: n.netns for n in local_cluster.nodes}),
    }
    found = local_cluster.run_driver(DRIVER, "routed", str(path), env=env, timeout=300)
    result = found["result"]
    assert result["status"] == "succeeded", result.get("error")
    assert found["keys"] == [key]  # added on the control host, on the way out
    # The turn's secret, presented again from its node after the turn: the hub still listens
    # (the connection is made) and closes it without a word.
    assert [(a["code"], a["said"]) for a in found["after"]] == [(0, "")], found["after"]
    probe = json.loads(git(repo, "show", f"{result['branch']}:probe.json"))
    assert probe["answer"]["model"] == "served-mock-model"
    assert probe["found"] == [] and probe["interfaces"] == ["lo"]
    node = local_cluster.node(result["worker_node"])
    # The agent's folder (state root, repositories), the engine's containers (their logs and
    # configs) and Ray's (its workers' logs) on the node.
    folders = [node.name + "/agent", node.name + "/data/containers", node.name + "/ray"]
    on_disk = [
        str(p)
        for folder in folders
        for p in (local_cluster.scratch / folder).rglob("*")
        if p.is_file() and not p.is_symlink() and marker in _head(p)
    ]
    assert on_disk == []
    environs = []
    for pid in in_netns(node.netns):
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes():
                environs.append(pid)
        except OSError:
            continue
    assert environs == []


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            return handle.read(1 << 20)
    except OSError:
        return b""


def test_a_compete_of_three_spreads_its_candidates_over_the_nodes(local_cluster, repo, workdir):
    spec = mock_task(repo, {"sleep": 3, "write": {"answer.txt": "42\n"}}, verify=["true"])
    path = workdir / "compete-spec.json"
    path.write_text(json.dumps(spec))
    env = {"WORKER_BRIDGE_HOME": str(workdir / "compete-home")}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    found = local_cluster.run_driver(DRIVER, "compete", str(path), "3", env=env, timeout=300)
    assert found["job"]["status"] == "succeeded", found["job"].get("error")
    tasks = found["tasks"]
    assert [t["status"] for t in tasks] == ["succeeded"] * 3
    assert {t["worker_node"] for t in tasks} == {n.name for n in local_cluster.nodes}
    diffs = {Path(t["artifacts"]["diff"]).read_bytes() for t in tasks}
    assert len(diffs) == 1  # the same change, wherever it ran


def test_without_a_registry_the_image_streams_from_the_control_host_by_id(
    local_cluster, repo, workdir
):
    image = "worker-bridge/mock:0.1.0"
    for node in local_cluster.nodes:  # neither node holds it: it must come from here
        engine = node.sandbox()
        for info in engine.containers({}):
            engine.remove(info.id)
        held = engine.inspect_image(image)
        if held is not None:  # by id: every name of it goes
            engine.client.images.remove(held.id, force=True)
    home = workdir / "stream-home"
    env = {"WORKER_BRIDGE_CLUSTER__REGISTRY": "", "WORKER_BRIDGE_HOME": str(home)}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    spec = mock_task(repo, {"write": {"s.txt": "x\n"}})
    path = workdir / "stream-spec.json"
    path.write_text(json.dumps(spec))
    first = local_cluster.run_driver(DRIVER, "run", str(path), env=env, timeout=300)
    assert first["status"] == "succeeded", first.get("error")
    sent = [e.data for e in _events(home, first["task_id"]) if e.kind == "cluster.image_sent"]
    assert [(s["node"], s["image"]) for s in sent] == [(first["worker_node"], image)]
    assert sent[0]["bytes"] > 50_000_000
    held = local_cluster.node(first["worker_node"]).sandbox().inspect_image(image)
    assert held is not None and held.id == DockerSandbox().inspect_image(image).id
    second = local_cluster.run_driver(DRIVER, "run", str(path), env=env, timeout=300)
    if second["worker_node"] == first["worker_node"]:  # held now: not sent again
        assert not [e for e in _events(home, second["task_id"]) if e.kind == "cluster.image_sent"]
    print(
        f"image streamed: {sent[0]['bytes'] / 1e6:.0f} MB in {sent[0]['seconds']:.1f} s",
        file=sys.stderr,
    )


def test_a_node_holding_another_image_under_the_workers_name_never_runs_it(
    local_cluster, repo, workdir
):
    image = "worker-bridge/mock:0.1.0"
    genuine = DockerSandbox().inspect_image(image)
    assert genuine is not None
    impostors = {}
    try:
        for node in local_cluster.nodes:  # whichever node the turn lands on holds an impostor
            engine = node.sandbox()
            put_image(DockerSandbox(), engine, image, node_name=node.name)
            impostors[node.name] = _impostor(engine, genuine.id, image)
        seen = "if [ -e /wb-impostor ]; then echo impostor; else echo genuine; fi > seen.txt"
        spec = mock_task(repo, {"script": seen})
        result = on_cluster(local_cluster, workdir / "impostor-home", spec, workdir)
        assert result["status"] == "succeeded", result.get("error")
        assert git(repo, "show", f"{result['branch']}:seen.txt") == "genuine\n"
        held = local_cluster.node(result["worker_node"]).sandbox().inspect_image(image)
        assert held is not None and held.id == genuine.id  # the name is the control host's again
    finally:
        for name, impostor in impostors.items():
            local_cluster.node(name).sandbox().client.images.remove(impostor, force=True)


def _impostor(engine: DockerSandbox, genuine: str, name: str) -> str:
    """An image made from ``genuine`` with /wb-impostor added, tagged ``name`` on ``engine``."""
    box = engine.client.containers.run(
        genuine,
        ["touch /wb-impostor"],
        entrypoint=["sh", "-c"],
        user="0",
        network_mode="none",
        labels={"io.worker-bridge.test": "impostor"},
        detach=True,
    )
    try:
        assert box.wait(timeout=60)["StatusCode"] == 0
        impostor = box.commit().id
    finally:
        box.remove(force=True)
    engine.client.api.tag(impostor, *name.split(":"), force=True)
    return impostor
