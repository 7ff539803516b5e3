"""The simulated cluster (scripts/local-cluster, issue 44) as every later part of the cluster will
use it: each node's own engine runs a container with worker-bridge's full hardening through the
unchanged `DockerSandbox` (its cgroup under the node's parent, runsc registered as on the main
engine); an image of the control host's engine reaches a node by id, by the registry or by a
stream, with the same id, and a node holding another image under the name is refused; a Ray
task pinned to a node runs there, against that node's engine, with token authentication on and
no retry; a node killed by pid leaves no process and comes back with its images; `down`
leaves nothing behind and the main engine as it was.

One cluster serves the whole module (tests/support/cluster.py); its last test takes it down."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest
from support.cluster import (
    SCRIPT,
    VENV,
    LocalCluster,
    in_netns,
    leftovers,
    process_tree,
    running,
)
from support.engine import BASE_IMAGE

from bridge.cluster.images import Registry, check_image, put_image
from bridge.errors import ImageMismatch
from bridge.sandbox import LABEL, ContainerSpec, DockerSandbox, Mount

pytestmark = [pytest.mark.docker, pytest.mark.cluster]

DRIVER = Path(__file__).with_name("ray_driver.py")
PROBE = r"""
grep -E '^(Uid|Gid|CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
echo "net $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ,)"
touch /probe 2>/dev/null && echo "root writable" || echo "root read-only"
echo "pids $(cat /sys/fs/cgroup/pids/pids.max)"
echo "memory $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
echo "memsw $(cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes 2>/dev/null || echo -)"
echo "cpu $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
echo "cgroup $(grep -E ':memory:' /proc/self/cgroup | cut -d: -f3)"
echo "written $(cat /workspace/in.txt)" > /workspace/out.txt
"""


def _labels(test: str) -> dict[str, str]:
    return {f"{LABEL}.task": f"cluster-{test}-{secrets.token_hex(4)}", f"{LABEL}.role": "cluster"}


def _spec(workspace: Path, script: str, labels: dict[str, str], **fields) -> ContainerSpec:
    return ContainerSpec(
        image=BASE_IMAGE,
        command=["sh", "-c", script],
        user="10001:10001",
        labels=labels,
        mounts=[Mount(workspace, "/workspace", read_only=False)],
        memory_mb=256,
        cpus=0.5,
        pids=128,
        tmpfs=("/tmp",),
        **fields,
    )


def _workspace(workdir: Path, name: str) -> Path:
    path = workdir / name
    path.mkdir()
    (path / "in.txt").write_text(f"{name}\n")
    os.chown(path, 10001, 10001)
    return path


def _run(sandbox: DockerSandbox, spec: ContainerSpec) -> tuple[int | None, str, dict]:
    """Start, wait, read: the exit code, the output and the engine's inspect; then remove."""
    container = sandbox.start(spec)
    try:
        info = sandbox.wait(container, timeout=120)
        output = b"".join(sandbox.output(container, tail=200)).decode()
        return info.exit_code, output, sandbox.client.api.inspect_container(container)
    finally:
        sandbox.remove(container)


def _fields(output: str) -> dict[str, str]:
    found = {}
    for line in output.splitlines():
        key, _, value = line.partition(":" if line[:1].isupper() else " ")
        found[key.strip()] = value.strip()
    return found


@pytest.fixture(scope="module")
def placed(session_cluster: LocalCluster) -> dict:
    """BASE_IMAGE on every node: n1 by the registry, the others streamed; each transfer."""
    local_cluster = session_cluster
    if not local_cluster.is_up():
        local_cluster.up()
    host = DockerSandbox()
    state = local_cluster.state()
    registry = Registry(state["registry_push"], state["registry_pull"])
    transfers = {}
    for index, node in enumerate(local_cluster.nodes):
        way = registry if index == 0 else None
        transfers[node.name] = put_image(
            host, node.sandbox(), BASE_IMAGE, registry=way, node_name=node.name
        )
    return {"transfers": transfers, "source": host.inspect_image(BASE_IMAGE)}


def test_an_image_moved_by_id_arrives_with_the_same_id_by_registry_and_by_stream(
    local_cluster,
    placed,
):
    source = placed["source"]
    first, *others = (placed["transfers"][n.name] for n in local_cluster.nodes)
    assert [first.method, *{t.method for t in others}] == ["registry", "stream"]
    assert first.digest and first.digest.startswith("sha256:")
    assert [t.digest for t in others] == [None] * len(others)
    for node in local_cluster.nodes:
        found = node.sandbox().inspect_image(BASE_IMAGE)
        assert found is not None and found.id == source.id, node.name
        assert BASE_IMAGE in found.tags
    again = put_image(DockerSandbox(), local_cluster.nodes[0].sandbox(), BASE_IMAGE)
    assert (again.method, again.image_id) == ("present", source.id)
    # The control host's engine keeps its image as it was: its tags, no temporary one.
    after = DockerSandbox().inspect_image(source.id)
    assert after is not None and after.tags == source.tags
    print({n: (t.method, t.seconds) for n, t in placed["transfers"].items()})


def test_a_node_holding_another_image_under_the_name_is_refused_until_it_is_put_again(
    local_cluster,
    placed,
    workdir,
):
    node = local_cluster.nodes[-1]
    sandbox = node.sandbox()
    expected = placed["source"].id
    labels = _labels("other")
    container = sandbox.start(_spec(_workspace(workdir, "other"), "true", labels))
    sandbox.wait(container, timeout=60)
    other = sandbox.commit(container, f"wbtest/other:{secrets.token_hex(3)}", labels)
    sandbox.remove(container)
    try:
        sandbox.client.api.tag(other, *BASE_IMAGE.split(":"), force=True)
        with pytest.raises(ImageMismatch) as refused:
            check_image(sandbox, BASE_IMAGE, expected, node_name=node.name)
        assert isinstance(refused.value, ValueError)
        assert f"{node.name} has image {other}" in str(refused.value)
        again = put_image(DockerSandbox(), sandbox, BASE_IMAGE, node_name=node.name)
        assert again.method == "present"  # the right image was still there, under its id
        check_image(sandbox, BASE_IMAGE, expected, node_name=node.name)
    finally:
        sandbox.remove_image(other)


def test_each_node_runs_a_container_with_worker_bridges_hardening_on_its_own_engine(
    local_cluster,
    placed,
    workdir,
):
    for node in local_cluster.nodes:
        sandbox = node.sandbox()
        workspace = _workspace(workdir, node.name)
        code, output, attrs = _run(sandbox, _spec(workspace, PROBE, _labels("harden")))
        assert code == 0, output
        seen = _fields(output)
        assert seen["Uid"].split()[:2] == ["10001", "10001"]
        assert seen["CapEff"] == seen["CapBnd"] == "0000000000000000"
        assert (seen["NoNewPrivs"], seen["Seccomp"]) == ("1", "2")
        assert seen["net"] == "lo,", "only a loopback: no network"
        assert seen["root"] == "read-only"
        assert seen["pids"] == "128"
        assert seen["memory"] == str(256 * 2**20)
        assert seen["memsw"] in (seen["memory"], "-")  # "-": the kernel accounts no swap
        assert seen["cpu"] == "50000 100000"
        assert seen["cgroup"].startswith(f"/{node.cgroup_parent}/"), "the node's cgroup parent"
        assert (workspace / "out.txt").read_text() == f"written {node.name}\n"
        host = attrs["HostConfig"]
        assert (host["NetworkMode"], host["CapDrop"], host["ReadonlyRootfs"]) == (
            "none",
            ["ALL"],
            True,
        )
        assert host["SecurityOpt"] == ["no-new-privileges"]
        assert host["Memory"] == host["MemorySwap"] == 256 * 2**20  # no swap beyond memory
        assert attrs["Config"]["User"] == "10001:10001"
        # It ran on this node's engine, not on the main one.
        root = sandbox.client.info()["DockerRootDir"]
        assert root.startswith(f"{local_cluster.scratch}/{node.name}/")
        assert not DockerSandbox().containers(
            {f"{LABEL}.task": attrs["Config"]["Labels"][f"{LABEL}.task"]}
        )


def test_each_node_registers_runsc_as_the_main_engine_does_and_runs_under_it(
    local_cluster,
    placed,
    workdir,
):
    for node in local_cluster.nodes:
        assert node.sandbox().runtimes()["runsc"] == ["--host-uds=open", "--network=none"]
    if not Path("/usr/bin/runsc").exists():
        if os.environ.get("WORKER_BRIDGE_REQUIRE_RUNSC") == "1":
            pytest.fail("WORKER_BRIDGE_REQUIRE_RUNSC=1 but /usr/bin/runsc is missing")
        pytest.skip("runsc is not installed")
    node = local_cluster.nodes[0]
    spec = _spec(_workspace(workdir, "gvisor"), "dmesg | head -1; uname -r", _labels("gvisor"))
    code, output, _ = _run(node.sandbox(), ContainerSpec(**{**spec.__dict__, "runtime": "runsc"}))
    assert code == 0, output
    assert "gVisor" in output


def test_a_ray_task_pinned_to_a_node_runs_there_on_that_nodes_engine(
    local_cluster,
):
    names = [n.name for n in local_cluster.nodes]
    found = local_cluster.run_driver(DRIVER, "where", *names)
    where = found["where"]
    for node in local_cluster.nodes:
        assert where[node.name]["netns"] == os.stat(f"/run/netns/{node.netns}").st_ino
        assert where[node.name]["node_ip"] == node.ip
        assert found["nodes"][where[node.name]["node_id"]] == node.ip
        assert where[node.name]["docker_host"] == node.docker_host
        root = node.sandbox().client.info()["DockerRootDir"]
        assert where[node.name]["docker_root"] == root
    assert len({where[n]["node_id"] for n in names}) == len(names)


def test_a_ray_task_whose_worker_dies_is_reported_and_never_run_again(
    local_cluster,
    workdir,
):
    ran = workdir / "ran.txt"
    found = local_cluster.run_driver(DRIVER, "crash", local_cluster.nodes[0].name, str(ran))
    assert found["outcome"] == "WorkerCrashedError"
    assert ran.read_text() == "ran\n"


def test_the_head_refuses_a_client_without_the_clusters_token(local_cluster, workdir):
    wrong = workdir / "wrong-token"
    wrong.write_text(secrets.token_hex(32))
    wrong.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(wrong))
    probe = SCRIPT.parent / "local_cluster" / "ray_probe.py"
    state = local_cluster.state()
    done = subprocess.run(
        ["nsenter", f"--net=/run/netns/{state['control_netns']}", "--"]
        + [str(VENV / "bin" / "python"), str(probe), state["address"], "--timeout", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 1 and answer["nodes"] == [], answer
    assert "auth" in answer["error"].lower() or "token" in answer["error"].lower(), answer
    assert (Path(state["token_file"]).stat().st_mode & 0o777) == 0o600


def test_a_killed_node_leaves_no_process_and_comes_back_with_its_images(
    local_cluster,
    placed,
    workdir,
):
    node = local_cluster.nodes[-1]
    sandbox = node.sandbox()
    labels = _labels("kill")
    container = sandbox.start(_spec(_workspace(workdir, "kill"), "sleep 300", labels))
    pid = sandbox.container_pid(container)
    assert pid is not None
    recorded = [p for p in local_cluster.state()["processes"] if p["node"] == node.name]
    tree = [q for p in recorded for q in process_tree(p["pid"])] + [pid]
    began = time.monotonic()
    local_cluster.script("kill", node.name, timeout=60)
    killed_s = time.monotonic() - began
    assert running(tree) == []
    assert in_netns(node.netns) == []
    status = {n["name"]: n for n in local_cluster.status()["nodes"]}
    assert status[node.name]["alive"] is False and status[node.name]["processes"] == []
    assert status[local_cluster.nodes[0].name]["alive"] is True

    began = time.monotonic()
    local_cluster.script("start", node.name, timeout=180)
    started_s = time.monotonic() - began
    status = {n["name"]: n for n in local_cluster.status()["nodes"]}
    assert status[node.name]["alive"] is True and status[node.name]["ray"] is True
    sandbox = node.sandbox()
    found = sandbox.inspect_image(BASE_IMAGE)
    assert found is not None and found.id == placed["source"].id
    assert [c.state for c in sandbox.containers(labels)] in ([], ["exited"])
    sandbox.remove(container)
    code, output, _ = _run(sandbox, _spec(_workspace(workdir, "back"), PROBE, _labels("back")))
    assert code == 0, output
    where = local_cluster.run_driver(DRIVER, "where", node.name)["where"][node.name]
    assert where["node_ip"] == node.ip
    print(f"kill {killed_s:.2f} s, start again {started_s:.2f} s")


def test_down_leaves_nothing_behind_and_the_main_engine_as_it_was(
    local_cluster,
    placed,
    workdir,
):
    """Last in the module: it takes the session's cluster down (the fixture's own `down` then
    finds nothing, which is `down` run twice)."""
    node = local_cluster.nodes[0]
    sandbox = node.sandbox()
    running = sandbox.start(_spec(_workspace(workdir, "down"), "sleep 300", _labels("down")))
    container_pid = sandbox.container_pid(running)
    state = local_cluster.state()
    tree = [q for p in state["processes"] for q in process_tree(p["pid"])]
    began = time.monotonic()
    local_cluster.down()
    down_s = time.monotonic() - began
    left = leftovers(local_cluster, state["processes"], [*tree, container_pid])
    assert left == {k: [] for k in left}, left
    host = DockerSandbox()
    source = placed["source"]
    after = host.inspect_image(BASE_IMAGE)
    assert after is not None and (after.id, after.tags) == (source.id, source.tags)
    pushed = f"{state['registry_push']}/"
    assert not [t for i in host.client.api.images() for t in i.get("RepoTags") or () if pushed in t]
    local_cluster.down()  # again: nothing to do, no error
    print(f"down {down_s:.2f} s")
