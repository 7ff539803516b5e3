"""The container pool (issue 23, part 2; bridge/sandbox/pool.py): a pooled container is hardened
exactly like a cold one, runs the task's command as its own (exit, output, environment, OOM,
timeout kill), is claimed by one task only (two processes racing for one slot: one wins), is
removed after its task and never handed to another, and what a process killed with -9 left
(its slots, containers and mounts) is reclaimed or adopted by the next process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.config.sections import PoolConfig
from bridge.host.mountinfo import mount_points
from bridge.sandbox import LABEL, ContainerSpec, DockerSandbox, Mount, home_id
from bridge.sandbox.pool import PooledSandbox, wait_for_fillers
from bridge.sandbox.pool_shape import CONTROL
from bridge.store import Store
from bridge.store.owners import Owner

ROOT = Path(__file__).resolve().parents[2]
SLOT = f"{LABEL}.slot"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="pool mounts need root")


def _spec(home: Path, workspace: Path, command: str, task: str, image: str, **fields):
    settings = {"memory_mb": 256, "tmpfs": ("/tmp", "/home/worker"), **fields}
    return ContainerSpec(
        image=image,
        command=["sh", "-c", command],
        user="10001:10001",
        labels={f"{LABEL}.task": task, f"{LABEL}.role": "verify", f"{LABEL}.home": home_id(home)},
        mounts=[
            Mount(workspace, "/workspace", read_only=False),
            Mount(workspace / "hook.txt", "/etc/worker-bridge/hook.txt", read_only=True),
            Mount(workspace / "sub", "/workspace/nested", read_only=True),
        ],
        env={"FOO": "a b'c $x", "HOME": "/home/worker"},
        **settings,
    )


def _workspace(root: Path, name: str) -> Path:
    path = root / name
    (path / "sub").mkdir(parents=True)
    (path / "file.txt").write_text(f"content of {name}\n")
    (path / "hook.txt").write_text("hook\n")
    (path / "sub" / "inner.txt").write_text("inner\n")
    os.chown(path, 10001, 10001)
    return path


def _pool(home: Path, size: int = 1) -> tuple[PooledSandbox, Store]:
    store = Store(home / "bridge.db")
    return PooledSandbox(DockerSandbox(), store.pool, home, PoolConfig(size=size)), store


def _logs(container_id: str) -> str:
    return b"".join(DockerSandbox().output(container_id, tail=200)).decode()


def _inspect(container_id: str) -> dict:
    return DockerSandbox().client.api.inspect_container(container_id)


def _pool_mounts(home: Path) -> set[str]:
    return mount_points(home / "pool") - {str(home / "pool")}


@needs_root
def test_a_pooled_container_is_a_cold_one_in_all_but_its_mounts(docker_images, workdir, home):
    image = docker_images.verify_image_ref
    sandbox, store = _pool(home)
    script = (
        'pwd; cat file.txt; cat nested/inner.txt; cat /etc/worker-bridge/hook.txt; echo "$FOO";'
        f" id -u; ls -A {CONTROL}; echo done > out.txt; echo to-stderr >&2;"
        " echo ---; grep /pool/ /proc/self/mountinfo; exit 3"
    )
    cold = sandbox.start(_spec(home, _workspace(workdir, "one"), script, "task-one", image))
    assert sandbox.origin(cold)["pooled"] is False  # nothing pooled yet: made cold, then refilled
    wait_for_fillers()
    two = _workspace(workdir, "two")
    pooled = sandbox.start(_spec(home, two, script, "task-two", image))
    assert sandbox.origin(pooled) == {"pooled": True, "slot": sandbox.origin(pooled)["slot"]}
    try:
        a, b = _inspect(cold), _inspect(pooled)
        hosts = [dict(x["HostConfig"]) for x in (a, b)]
        targets = [sorted(m["Target"] for m in h.pop("Mounts")) for h in hosts]
        assert hosts[0] == hosts[1]  # network none, caps, seccomp, ro root, limits, runtime, log
        assert hosts[0]["NetworkMode"] == "none" and hosts[0]["CapDrop"] == ["ALL"]
        tops = ["/etc/worker-bridge/hook.txt", "/workspace"]
        assert targets == [[*tops, "/workspace/nested"], sorted([*tops, CONTROL])]
        assert a["Config"]["User"] == b["Config"]["User"] == "10001:10001"
        assert b["Config"]["Labels"][f"{LABEL}.slot"] == sandbox.origin(pooled)["slot"]
        # The recovery and cancel paths find it by the task's labels, as a cold one.
        found = sandbox.containers({f"{LABEL}.task": "task-two"})
        assert [(c.id, c.labels[f"{LABEL}.role"]) for c in found] == [(pooled, "verify")]
        info = sandbox.wait(pooled, timeout=60)
        assert (info.exit_code, info.oom_killed, info.timed_out) == (3, False, False)
        assert info.duration_s is not None
        # The engine's log may put the stderr line anywhere among the stdout ones.
        every = _logs(pooled).splitlines()
        assert "to-stderr" in every
        lines = [line for line in every if line != "to-stderr"]
        assert lines[:6] == ["/workspace", "content of two", "inner", "hook", "a b'c $x", "10001"]
        # Its control folder holds only the release script the host wrote (the FIFO is gone
        # once the command runs), and of the pool's folders it sees its own slot's points only.
        assert lines[6:8] == ["release", "---"]
        slot = sandbox.origin(pooled)["slot"]
        seen = lines[lines.index("---") + 1 :]
        assert len(seen) == 3 and all(f"/pool/{slot}/" in line for line in seen)
        assert (two / "out.txt").read_text() == "done\n"
    finally:
        for container in (cold, pooled):
            sandbox.remove(container)
    assert not sandbox.containers({f"{LABEL}.task": "task-two"})
    wait_for_fillers()
    assert [s.state for s in store.pool.rows()] == ["idle"]  # the refill; never the used one
    assert store.pool.by_container(pooled) is None
    assert _pool_mounts(home) == set()
    sandbox.drain()
    store.close()


@needs_root
def test_a_pooled_container_keeps_the_oom_and_the_timeout_kill(docker_images, workdir, home):
    image = docker_images.verify_image_ref
    sandbox, store = _pool(home, size=2)
    hog = "head -c 400000000 /dev/zero | tail > /dev/null"  # tail holds the one line in memory
    small = _spec(home, _workspace(workdir, "w0"), hog, "t0", image, memory_mb=64)
    assert sandbox.prefill(small) == 2
    oom = sandbox.start(_spec(home, _workspace(workdir, "w1"), hog, "t1", image, memory_mb=64))
    slow = _spec(home, _workspace(workdir, "w2"), "sleep 60", "t2", image, memory_mb=64)
    slow = sandbox.start(slow)
    assert sandbox.origin(oom)["pooled"] is True and sandbox.origin(slow)["pooled"] is True
    try:
        info = sandbox.wait(oom, timeout=60)
        assert info.oom_killed and info.exit_code != 0
        info = sandbox.wait(slow, timeout=0.5)
        assert info.timed_out
        assert _inspect(slow)["State"]["Running"] is False
    finally:
        for container in (oom, slow):
            sandbox.remove(container)
        wait_for_fillers()
        sandbox.drain()
    assert store.pool.rows() == [] and _pool_mounts(home) == set()
    store.close()


_CLAIMER = """
import json, sys, time
from pathlib import Path
from bridge.store import Store
from bridge.store.owners import Owner
store, go = Store(sys.argv[1]), Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
slot = store.pool.claim("shape", Owner(), sys.argv[3], {})
print(json.dumps(slot.slot_id if slot else None))
"""


def test_two_processes_racing_for_one_slot_one_wins(home):
    store = Store(home / "bridge.db")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for round_ in range(4):
        slot = f"slot-{round_}"
        owner = Owner()
        assert store.pool.reserve(
            slot, "shape", owner, 64, size=1, max_containers=8, max_memory_mb=1024
        )
        assert store.pool.filled(slot, f"container-{round_}" * 4, time.time() + 60)
        go = home / f"go-{round_}"
        racers = [
            subprocess.Popen(
                [sys.executable, "-c", _CLAIMER, str(home / "bridge.db"), str(go), f"task-{n}"],
                stdout=subprocess.PIPE,
                env=env,
            )
            for n in range(2)
        ]
        time.sleep(0.3)  # both waiting for the go (not a timing assertion: a late one loses too)
        go.touch()
        results = [json.loads(p.communicate(timeout=60)[0]) for p in racers]
        assert sorted(results, key=str) == [None, slot]
        row = store.pool.get(slot)
        assert row is not None and row.state == "claimed"
        assert store.pool.claim("shape", owner, "late", {}) is None  # and never a second time
    store.close()


_HOLDER = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.sandbox.test_pool import _pool, _spec, _workspace
from bridge.sandbox.pool import wait_for_fillers
home, work, image = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
sandbox, store = _pool(home, size=3)
first = _spec(home, _workspace(work, "a"), "sleep 300", "gone-task", image)
sandbox.prefill(first)
running = sandbox.start(first)  # serving a task the store does not know
wait_for_fillers()  # back to three idle ones
plan = __import__("bridge.sandbox.pool_shape", fromlist=["x"]).make_plan(
    first, sandbox.inner.inspect_image(image).id)
claimed = store.pool.claim(plan.key, sandbox.pool.owner, "half-claimed", {})
store.pool.reserve("half-filled", plan.key, sandbox.pool.owner, 64, size=9,
                   max_containers=64, max_memory_mb=99999)
print(sandbox.pool.owner.id, running, claimed.slot_id, flush=True)
time.sleep(600)
"""


@needs_root
def test_a_pool_left_by_a_killed_process_is_reclaimed_by_the_next(docker_images, workdir, home):
    from bridge.config.settings import load_config
    from bridge.phase.context import Context
    from bridge.pipeline.recovery import remove_orphan_containers

    image = docker_images.verify_image_ref
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(ROOT), str(home), str(workdir), image],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"},
    )
    try:
        owner, running, half_claimed = holder.stdout.readline().split()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    sandbox, store = _pool(home, size=3)
    held = DockerSandbox().containers({f"{LABEL}.pool": owner})
    assert len(held) == 4  # serving one task, two idle, one claimed: all the killed one's
    assert len(_pool_mounts(home)) == 3  # the serving slot's points
    states = sorted(s.state for s in store.pool.rows())
    assert states == ["claimed", "filling", "idle", "idle", "running"]

    undone = sandbox.reclaim()  # the next process: what the dead one was doing goes
    assert half_claimed in undone and "half-filled" in undone
    config = load_config(env={"WORKER_BRIDGE_HOME": str(home)})
    assert remove_orphan_containers(Context(config, store, DockerSandbox())) == 1  # its task's
    assert not DockerSandbox().containers({f"{LABEL}.task": "gone-task"})
    assert running not in {c.id for c in DockerSandbox().containers({f"{LABEL}.pool": owner})}
    assert sorted(s.state for s in store.pool.rows()) == ["idle", "idle"]  # adopted
    assert _pool_mounts(home) == set()

    # The idle ones it made serve this process's tasks, each once.
    adopted = sandbox.start(_spec(home, _workspace(workdir, "b"), "cat file.txt", "next", image))
    assert sandbox.origin(adopted)["pooled"] is True
    assert sandbox.wait(adopted, timeout=60).exit_code == 0
    assert _logs(adopted).strip() == "content of b"
    sandbox.remove(adopted)
    wait_for_fillers()
    sandbox.drain()
    assert not DockerSandbox().containers({f"{LABEL}.home": home_id(home)})
    assert store.pool.rows() == [] and _pool_mounts(home) == set()
    assert sorted(os.listdir(home / "pool")) == []
    store.close()


@needs_root
def test_gvisor_tasks_skip_the_pool_and_say_why(docker_images, workdir, home):
    if "runsc" not in DockerSandbox().runtimes():
        pytest.skip("runsc is not registered")
    sandbox, store = _pool(home)
    spec = _spec(home, _workspace(workdir, "g"), "true", "t", docker_images.verify_image_ref)
    spec.runtime = "runsc"
    container = sandbox.start(spec)
    try:
        origin = sandbox.origin(container)
        assert origin["pooled"] is False and "gVisor" in origin["why"]
    finally:
        sandbox.remove(container)
    wait_for_fillers()
    assert store.pool.rows() == []  # nothing is made for a shape the pool skips
    store.close()


def test_a_failed_release_script_check_refuses_an_unmounted_point():
    from bridge.sandbox.pool_shape import NOT_MOUNTED, Plan, Point, release_script

    spec = ContainerSpec("i", ["echo", "it's"], "1:1", {}, env={"A": "x y"})
    plan = Plan(spec, "id", (Point("/workspace", "dir"), Point("/f", "file")), [], [], "k")
    script = release_script(plan, spec, ".tok")
    assert f"[ -e /workspace/.tok ] && exit {NOT_MOUNTED}" in script
    assert "  exec echo 'it'\"'\"'s'\n}\nwb_release\n" in script
    assert "export 'A=x y'" in script


@needs_root
def test_tasks_take_fresh_pooled_containers_and_never_one_used(docker_images, home, repo):
    from bridge import WorkerBridge

    (home / "config.yaml").write_text("pool:\n  size: 1\n")
    bridge = WorkerBridge(home=home)
    peek = f"ls -A {CONTROL}; grep -r secret-of /workspace /tmp /home 2>/dev/null; true"
    used: list[set[str]] = []
    try:
        for n in range(3):
            spec = {
                "objective": "write a file",
                "worker": "mock",
                "workspace": {"repository": str(repo)},
                "metadata": {"mock": {"script": f"{peek}; echo secret-of-{n} > secret.txt"}},
                "verification": {
                    "commands": [
                        f"grep -qx secret-of-{n} secret.txt",
                        # nothing of the pool's but its own release script
                        f"! ls -A {CONTROL} 2>/dev/null | grep -vqx release"
                        f" && ! grep -rq secret-of-{n - 1} /tmp",
                    ]
                },
            }
            result = bridge.run_task(bridge.create_task(spec).task_id).document()
            assert result["status"] == "succeeded", result["error"]
            events = bridge.task_logs(result["task_id"]).events
            notes = [e.data for e in events if e.kind == "sandbox.pool"]
            assert [d["role"] for d in notes] == ["worker", "verify", "verify"]
            if n > 0:  # the worker and the first command from the pool; the second from
                # the first's refill when it is ready in time (under load), else made cold
                assert [d["pooled"] for d in notes][:2] == [True, True]
            progress = [e.data.get("text", "") for e in events if e.kind == "worker.progress"]
            assert not any("secret-of" in text for text in progress)  # nothing of the last task
            used.append({d["container"] for d in notes})
            wait_for_fillers()
    finally:
        bridge.close()
    assert len(set.union(*used)) == sum(len(u) for u in used)  # no container served twice
    left = {c.id[:12] for c in DockerSandbox().containers({f"{LABEL}.home": home_id(home)})}
    assert left and not left & set.union(*used)  # only the refills are left, all idle
    store = Store(home / "bridge.db")
    assert {s.state for s in store.pool.rows()} == {"idle"}
    store.close()


@needs_root
def test_doctor_shows_the_pool_and_prune_drains_it(docker_images, workdir, home):
    from bridge import WorkerBridge

    sandbox, store = _pool(home, size=2)
    spec = _spec(home, _workspace(workdir, "p"), "true", "t", docker_images.verify_image_ref)
    assert sandbox.prefill(spec) == 2
    (home / "config.yaml").write_text("pool:\n  size: 2\n")
    bridge = WorkerBridge(home=home)
    try:
        check = next(c for c in bridge.doctor() if c["check"] == "pool")
        assert "2 idle" in check["detail"] and check["ok"]
        planned = [a for a in bridge.prune_workspaces()["actions"] if a["kind"] == "pool"]
        assert planned and "2 pooled container(s)" in planned[0]["reason"]
        applied = bridge.prune_workspaces(apply=True)["actions"]
        assert [a["failed"] for a in applied if a["kind"] == "pool"] == [None]
    finally:
        bridge.close()
    assert store.pool.rows() == [] and _pool_mounts(home) == set()
    assert not DockerSandbox().containers({f"{LABEL}.home": home_id(home)})
    store.close()


@needs_root
def test_an_idle_container_that_died_is_dropped_and_the_task_made_cold(
    docker_images, workdir, home
):
    image = docker_images.verify_image_ref
    sandbox, store = _pool(home)
    spec = _spec(home, _workspace(workdir, "d"), "cat file.txt", "t", image)
    assert sandbox.prefill(spec) == 1
    (dead,) = store.pool.rows()
    DockerSandbox().kill(str(dead.container_id))  # e.g. the engine restarted
    container = sandbox.start(spec)
    try:
        origin = sandbox.origin(container)
        assert origin["pooled"] is False and "not running" in origin["why"]
        assert sandbox.wait(container, timeout=60).exit_code == 0
        assert _logs(container).strip() == "content of d"
        assert store.pool.get(dead.slot_id) is None  # removed, mounts and all
        assert not DockerSandbox().containers({SLOT: dead.slot_id})
    finally:
        sandbox.remove(container)
        wait_for_fillers()
        sandbox.drain()
    assert _pool_mounts(home) == set()
    store.close()


@needs_root
def test_a_slot_s_mounts_stay_private_on_a_host_whose_mounts_are_shared(docker_images, workdir):
    """On a host whose mounts propagate (systemd's default: `/` is shared), a task's folders
    attached to a slot are private as the engine's binds are: the task's nested mount does not
    appear on the host's own folder, and a mount the host makes there later does not reach the
    container."""
    shared = workdir / "shared"
    shared.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(shared)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(shared)], check=True)
        home = shared / "home"
        home.mkdir()
        sandbox, store = _pool(home)
        workspace = _workspace(shared, "ws")
        (workspace / "later").mkdir()
        script = "while [ ! -e go ]; do sleep 0.05; done; ls -A later; echo end"
        spec = _spec(home, workspace, script, "t", docker_images.verify_image_ref)
        assert sandbox.prefill(spec) == 1
        container = sandbox.start(spec)
        try:
            assert sandbox.origin(container)["pooled"] is True
            # The nested mount (/workspace/nested) is the container's, not the host's folder's.
            assert mount_points(workspace) == set()
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(workspace / "later")], check=True)
            (workspace / "later" / "host-only").write_text("x")
            (workspace / "go").touch()
            assert sandbox.wait(container, timeout=60).exit_code == 0
            assert _logs(container).split() == ["end"]  # the host's later mount: not seen
        finally:
            sandbox.remove(container)
            wait_for_fillers()
            sandbox.drain()
            store.close()
    finally:
        subprocess.run(["umount", "-R", "-l", str(shared)], check=False)


@needs_root
def test_a_release_cut_short_runs_nothing(docker_images, workdir, home, monkeypatch):
    """The host dies while writing the release script: PID 1 reads a script cut short, and
    runs none of it (never the command with its last arguments missing)."""
    from bridge.sandbox import pool_shape

    sandbox, store = _pool(home)
    workspace = _workspace(workdir, "cut")
    spec = _spec(home, workspace, "true", "t", docker_images.verify_image_ref)
    spec.command = ["touch", "/workspace/a", "/workspace/b"]
    assert sandbox.prefill(spec) == 1
    whole = pool_shape.release_script

    def cut(plan, spec, token):
        script = whole(plan, spec, token)
        return script[: script.index(" /workspace/b")]  # ends `exec touch /workspace/a`

    monkeypatch.setattr(pool_shape, "release_script", cut)
    monkeypatch.setattr(sandbox, "refill", lambda plan: None)
    container = sandbox.start(spec)
    try:
        assert sandbox.origin(container)["pooled"] is True
        # `sh` refuses a script that does not parse (2) or exits after it (125).
        assert sandbox.wait(container, timeout=60).exit_code in (2, pool_shape.NOT_MOUNTED)
        assert not (workspace / "a").exists() and not (workspace / "b").exists()
    finally:
        sandbox.remove(container)
    assert store.pool.rows() == [] and _pool_mounts(home) == set()
    store.close()


@needs_root
def test_a_store_failing_at_the_handover_leaves_nothing_running(
    docker_images, workdir, home, monkeypatch
):
    """The store cannot record the handover (locked, full): the command is not handed to the
    pooled container, which is removed; the task's container is made cold and runs it once."""
    import sqlite3

    sandbox, store = _pool(home)
    workspace = _workspace(workdir, "locked")
    spec = _spec(
        home, workspace, "echo ran >> /workspace/runs", "t", docker_images.verify_image_ref
    )
    assert sandbox.prefill(spec) == 1
    (idle,) = store.pool.rows()

    def locked(slot_id, at):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(store.pool, "released", locked)
    monkeypatch.setattr(sandbox, "refill", lambda plan: None)
    container = sandbox.start(spec)
    try:
        origin = sandbox.origin(container)
        assert origin["pooled"] is False and "database is locked" in origin["why"]
        assert sandbox.wait(container, timeout=60).exit_code == 0
        assert not DockerSandbox().containers({SLOT: idle.slot_id})
        assert (workspace / "runs").read_text() == "ran\n"  # once, by the cold container
    finally:
        sandbox.remove(container)
    assert store.pool.rows() == [] and _pool_mounts(home) == set()
    store.close()


@needs_root
def test_a_claimed_container_is_found_by_its_task_before_its_command_runs(
    docker_images, workdir, home
):
    """Between the claim and the handover a pooled container is its task's: cancel and
    recovery find it by the task's labels (as `created`: adopt removes it, never waits on it)."""
    from bridge.sandbox.pool_shape import make_plan

    sandbox, store = _pool(home)
    image = docker_images.verify_image_ref
    spec = _spec(home, _workspace(workdir, "c"), "true", "claimed-task", image)
    assert sandbox.prefill(spec) == 1
    plan = make_plan(spec, DockerSandbox().inspect_image(image).id)
    slot = store.pool.claim(plan.key, Owner(), "claimed-task", spec.labels)
    assert slot is not None
    found = sandbox.containers({f"{LABEL}.task": "claimed-task"})
    assert [(c.id, c.state) for c in found] == [(slot.container_id, "created")]
    assert sandbox.remove_by_labels({f"{LABEL}.task": "claimed-task"}) == 1
    assert not DockerSandbox().containers({SLOT: slot.slot_id})
    assert store.pool.rows() == [] and _pool_mounts(home) == set()
    store.close()


_ELSEWHERE = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.sandbox.test_pool import _pool, _spec
home, workspace, image = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
sandbox, store = _pool(home)
sandbox.refill = lambda plan: None
container = sandbox.start(_spec(home, workspace, "cat file.txt", "t", image))
info, origin = sandbox.wait(container, timeout=60), sandbox.origin(container)
sandbox.remove(container)
print(json.dumps({"origin": origin, "exit": info.exit_code}))
"""


@needs_root
def test_a_bridge_in_a_mount_namespace_of_its_own_makes_the_task_cold(docker_images, workdir, home):
    """A bridge whose mounts do not reach the engine's namespace (a systemd unit with
    PrivateTmp or ProtectSystem: a namespace of its own, a slave of the host's): the task's
    folders attached on a slot never reach the container, which is found before the command is
    handed over; the task's container is made cold, and runs."""
    sandbox, store = _pool(home)
    workspace = _workspace(workdir, "ns")
    spec = _spec(home, workspace, "true", "t", docker_images.verify_image_ref)
    assert sandbox.prefill(spec) == 1
    child = subprocess.run(
        ["unshare", "--mount", "--propagation", "slave", sys.executable, "-c", _ELSEWHERE]
        + [str(ROOT), str(home), str(workspace), docker_images.verify_image_ref],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"},
    )
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout.splitlines()[-1])
    assert result["exit"] == 0 and result["origin"]["pooled"] is False
    assert "did not reach" in result["origin"]["why"]
    sandbox.drain()
    assert store.pool.rows() == [] and _pool_mounts(home) == set()
    assert not DockerSandbox().containers({f"{LABEL}.home": home_id(home)})
    store.close()


def test_the_handover_check_never_follows_a_link_of_the_container_s_image(tmp_path):
    """The host looks for the slot's sentinel through /proc/PID/root as root: an image whose
    mount target is an absolute link (to a host FIFO here: an open of it would block for good;
    a device's open would act) must be read as not showing it, without the host opening what
    the link names; the folder and file sentinels themselves are still seen."""
    import threading

    from bridge.sandbox.pool_shape import Plan, Point, sentinel_shown

    def plan(*points: Point) -> Plan:
        return Plan(ContainerSpec("x", ["true"], "1000", {}), "i", points, [], [], "k")

    fifo = tmp_path / "host-fifo"
    os.mkfifo(fifo)
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "input.txt").symlink_to(fifo)  # absolute: resolves on the host, not in root
    (root / "via").symlink_to(tmp_path)  # a link on the way to a file point
    found: list = []
    worker = threading.Thread(
        target=lambda: found.append(
            sentinel_shown(
                root, plan(Point("/input.txt", "file"), Point("/via/host-fifo", "file")), "t"
            )
        ),
        daemon=True,
    )
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the host opened the FIFO a link of the image named"
    assert found == [None]
    (root / "workspace").mkdir()
    (root / "workspace" / "t").write_text("")
    (root / "etc" / "token").write_text("t\n")
    assert sentinel_shown(root, plan(Point("/workspace", "dir")), "t") == "/workspace"
    assert sentinel_shown(root, plan(Point("/etc/token", "file")), "t") == "/etc/token"
    assert sentinel_shown(root, plan(Point("/etc/token", "file")), "other") is None


# A host process of the sandbox uid (an account with that uid): it reads the idle container's
# command line and environment, then opens its control FIFO through /proc/PID/root and slips an
# `exit 0` in ahead of the host's release, holding the FIFO open until told to let go.
_FORGER = r"""
pid=$1
tr '\0' ' ' < /proc/$pid/cmdline; echo
tr '\0' ' ' < /proc/$pid/environ; echo
control=/proc/$pid/root{control}
echo 'exit 0' > $control/release 2>/dev/null && echo planted-release
if command exec 3>$control/go 2>/dev/null; then echo opened; printf 'exit 0\n' >&3
else echo refused; fi
read _
"""


@needs_root
def test_a_host_process_as_the_sandbox_uid_cannot_hand_a_pooled_container_its_command(
    docker_images, workdir, home, monkeypatch
):
    """Issue 43: a pooled container takes its command from the host alone. A process running
    as the sandbox uid on the host can read all an idle container shows it (command line,
    environment, its files through /proc/PID/root) and still cannot make a failing check pass:
    the release comes from the bridge's own files, which that uid can read but never write."""
    sandbox, store = _pool(home)
    spec = _spec(home, _workspace(workdir, "forged"), "false", "t", docker_images.verify_image_ref)
    assert sandbox.prefill(spec) == 1
    monkeypatch.setattr(sandbox, "refill", lambda plan: None)
    (idle,) = store.pool.rows()
    pid = DockerSandbox().container_pid(str(idle.container_id))
    forger = subprocess.Popen(
        ["sh", "-c", _FORGER.format(control=CONTROL), "forger", str(pid)],
        user=10001,
        group=10001,
        extra_groups=[],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert forger.stdin is not None and forger.stdout is not None
    try:
        assert "sh -c" in forger.stdout.readline()  # its command line, read
        assert "PATH=" in forger.stdout.readline()  # its environment, read
        said: list[str] = []  # "opened" (and its `exit 0` written), or "refused"
        while not said or said[-1].strip() not in ("opened", "refused"):
            said.append(forger.stdout.readline())
            assert said[-1], said  # it always ends with one of the two
        container = sandbox.start(spec)  # the host's release, while it may hold the FIFO
    finally:
        forger.stdin.close()
        forger.wait(timeout=60)
    try:
        assert sandbox.origin(container)["pooled"] is True
        assert sandbox.wait(container, timeout=60).exit_code == 1  # `false`, as it is
        assert said[-1].strip() == "refused" and "planted-release\n" not in said
    finally:
        sandbox.remove(container)
    assert store.pool.rows() == [] and _pool_mounts(home) == set()
    store.close()
