"""worker-bridge in its own container: the same-path check (fed mount lists, no engine), and the
bridge image for real: it builds, `doctor` passes and a mock task succeeds from inside it with
same-path mounts, and a state root or repository mounted at another path is refused with the
sentence that says how to mount it."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from support.tasks import bare_spec

from bridge.errors import ConfigError, InvalidSpec
from bridge.sandbox import host_paths
from bridge.sandbox.host_paths import container_id, deployment_checks, mount_problem
from bridge.version import __version__

ROOT = Path(__file__).resolve().parents[2]
BRIDGE_IMAGE = f"worker-bridge/bridge:{__version__}"
TEST_LABEL = "io.worker-bridge.test"
SOCKET = "/var/run/docker.sock"


def bind(source: str, dest: str | None = None) -> dict:
    return {"Type": "bind", "Source": source, "Destination": dest or source, "RW": True}


# -- the check, fed the engine's `Mounts` -----------------------------------------------------


def test_a_same_path_bind_mount_passes_also_for_a_path_below_it():
    mounts = [bind(SOCKET), bind("/srv/wb")]
    assert mount_problem("/srv/wb", mounts, "The state root") is None
    assert mount_problem("/srv/wb/home/", mounts, "The state root") is None


def test_a_different_path_names_the_host_path_and_the_mount_that_fixes_it():
    problem = mount_problem(
        "/data/wb", [bind("/srv/wb", "/data/wb")], "The state root", "WORKER_BRIDGE_HOME"
    )
    assert problem == (
        "The state root /data/wb is mounted from /srv/wb on the host; mount it at the same "
        "path: -v /srv/wb:/srv/wb and WORKER_BRIDGE_HOME=/srv/wb."
    )
    # below the mount point, the host path is the source plus the rest
    problem = mount_problem("/data/wb/home", [bind("/srv", "/data")], "The repository")
    assert problem == (
        "The repository /data/wb/home is mounted from /srv/wb/home on the host; mount it at the "
        "same path: -v /srv:/srv and name it by its host path /srv/wb/home."
    )


def test_the_innermost_mount_decides():
    mounts = [bind("/srv", "/srv"), bind("/elsewhere", "/srv/wb")]
    assert "mounted from /elsewhere/x on the host" in mount_problem("/srv/wb/x", mounts, "It")
    mounts = [bind("/x", "/srv"), bind("/srv/wb")]
    assert mount_problem("/srv/wb/x", mounts, "It") is None
    # /srv/wbx is not under /srv/wb
    assert mount_problem("/srv/wbx", [bind("/srv/wb")], "It").startswith("It /srv/wbx is inside")


def test_a_volume_or_no_mount_at_all_is_refused():
    volume = {
        "Type": "volume",
        "Name": "wb-state",
        "Source": "/var/lib/docker/volumes/wb/_data",
        "Destination": "/var/lib/worker-bridge",
    }
    assert mount_problem("/var/lib/worker-bridge", [volume], "The state root") == (
        "The state root /var/lib/worker-bridge is on the volume wb-state, which task containers "
        "cannot mount by that path; mount a host folder at the same path instead: "
        "-v /var/lib/worker-bridge:/var/lib/worker-bridge."
    )
    assert mount_problem("/root/.worker-bridge", [bind(SOCKET)], "The state root") == (
        "The state root /root/.worker-bridge is inside the bridge's container, not mounted from "
        "the host; mount a host folder at the same path: "
        "-v /root/.worker-bridge:/root/.worker-bridge."
    )


def test_the_container_id_comes_from_mountinfo_then_cgroup_then_the_hostname():
    cid = "a" * 64
    mountinfo = (
        f"612 590 254:0 /var/lib/docker/containers/{cid}/hostname /etc/hostname rw - ext4 x rw\n"
    )
    assert container_id(mountinfo, "0::/\n", "host") == cid
    assert container_id("", f"12:pids:/docker/{cid}\n", "host") == cid
    assert container_id("", f"0::/system.slice/docker-{cid}.scope\n", "host") == cid
    assert container_id("", "0::/\n", "3f2a1b0c9d8e") == "3f2a1b0c9d8e"


def test_outside_a_container_nothing_is_checked(monkeypatch, tmp_path):
    monkeypatch.delenv("WORKER_BRIDGE_IN_CONTAINER", raising=False)
    monkeypatch.setattr(host_paths, "own_mounts", lambda: pytest.fail("engine asked"))
    host_paths.require_state_root(tmp_path)
    host_paths.require_repository(tmp_path)
    assert deployment_checks(tmp_path) == []
    assert not host_paths.in_container({"WORKER_BRIDGE_IN_CONTAINER": "0"})
    assert host_paths.in_container({"WORKER_BRIDGE_IN_CONTAINER": "1"})


@pytest.fixture
def in_container(monkeypatch):
    """Pretend to be the bridge's container, with the given mounts."""

    def pretend(mounts: list[dict]) -> None:
        monkeypatch.setenv("WORKER_BRIDGE_IN_CONTAINER", "1")
        monkeypatch.setattr(host_paths, "_mounts", mounts)

    return pretend


def test_start_up_task_creation_and_doctor_refuse_what_differs(
    in_container, home, repo, bridge, capsys, monkeypatch
):
    from bridge.cli import main

    in_container([bind("/elsewhere", str(home.parent))])
    with pytest.raises(ConfigError, match="mount it at the same path: -v /elsewhere:/elsewhere"):
        host_paths.require_state_root(home)
    monkeypatch.setenv("WORKER_BRIDGE_HOME", str(home))
    assert main(["tasks", "list"]) == 2
    err = capsys.readouterr().err
    assert f"WORKER_BRIDGE_HOME=/elsewhere/{home.name}." in err
    checks = {name: (ok, detail) for name, ok, detail in deployment_checks(home)}
    assert checks["paths:home"][0] is False

    # the state root shared, the repository not: refused at creation, nothing recorded
    in_container([bind(str(home)), bind("/host/repo", str(repo))])
    host_paths.require_state_root(home)
    with pytest.raises(InvalidSpec, match=f"The repository {repo} is mounted from /host/repo"):
        bridge.create_task(bare_spec(repo))
    assert bridge.list_tasks() == []
    env = {"WORKER_BRIDGE_IN_CONTAINER": "1", "WORKER_BRIDGE_REPOS": f"{repo}:/srv/none"}
    checks = {(n, ok) for n, ok, _ in deployment_checks(home, env)}
    assert checks == {("paths:home", True), ("paths:repos", False)}


# -- the image, for real ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def bridge_image(docker_images):
    """The top-level Dockerfile built once per session FROM the base image (layers cached)."""
    import docker

    client = docker.from_env(timeout=600)
    started = time.monotonic()
    log = []
    for chunk in client.api.build(
        path=str(ROOT),
        tag=BRIDGE_IMAGE,
        buildargs={"BASE_IMAGE": docker_images.image_for("base")},
        rm=True,
        forcerm=True,
        decode=True,
    ):
        log.append(chunk.get("stream") or chunk.get("error") or "")
        if "error" in chunk:
            pytest.fail(f"building {BRIDGE_IMAGE} failed: {''.join(log[-20:])}")
    print(f"built {BRIDGE_IMAGE} in {time.monotonic() - started:.1f} s")
    yield client.images.get(BRIDGE_IMAGE)
    client.close()


def run_bridge(args: list[str], *, volumes: dict[str, str], env: dict[str, str]):
    """Run the bridge image once with the engine socket; returns (exit code, stdout, stderr)."""
    import docker

    client = docker.from_env(timeout=300)
    binds = {SOCKET: {"bind": SOCKET, "mode": "rw"}}
    binds.update({src: {"bind": dst, "mode": "rw"} for src, dst in volumes.items()})
    container = client.containers.run(
        BRIDGE_IMAGE,
        args,
        detach=True,
        volumes=binds,
        environment=env,
        labels={TEST_LABEL: "deploy"},
    )
    try:
        code = container.wait(timeout=240)["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
        return code, out, err
    finally:
        container.remove(force=True)
        client.close()


def test_the_image_is_labelled_and_runs_any_command(bridge_image):
    labels = bridge_image.labels
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.title"] == "worker-bridge"
    assert labels["org.opencontainers.image.source"]
    assert bridge_image.attrs["Config"]["Cmd"] == ["worker-bridge-mcp"]
    code, out, _ = run_bridge(["worker-bridge", "workers", "list", "--json"], volumes={}, env={})
    assert code == 0, out
    assert "mock" in {w["name"] for w in json.loads(out)["workers"]}


def test_doctor_passes_and_a_mock_task_succeeds_from_inside_the_container(bridge_image, home, repo):
    # two mounts, as compose makes them: a rename between them crosses devices
    same = {str(home): str(home), str(repo): str(repo)}
    env = {"WORKER_BRIDGE_HOME": str(home)}
    code, out, err = run_bridge(["worker-bridge", "doctor", "--json"], volumes=same, env=env)
    report = json.loads(out)
    assert code == 0, (out, err)
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["paths:home"]["ok"], checks["paths:home"]
    assert checks["engine"]["ok"]

    code, out, err = run_bridge(
        [
            "worker-bridge", "tasks", "run", "--repo", str(repo), "--worker", "mock",
            "--objective", "write a.txt", "--verify", "test -f a.txt", "--json",
            "--metadata-json", json.dumps({"mock": {"write": {"a.txt": "x"}}}),
        ],
        volumes=same,
        env=env,
    )  # fmt: skip
    assert code == 0, (out, err)
    result = json.loads(out)
    assert result["status"] == "succeeded", result
    assert result["verification"]["ok"] is True
    assert result["changed_files"] == [{"path": "a.txt", "change": "added"}]
    # the artifacts are the host's files: the same path inside and out
    assert Path(result["artifacts"]["diff"]).is_file()


def test_a_state_root_or_repository_at_another_path_is_refused(bridge_image, workdir, home, repo):
    elsewhere = workdir / f"x-{uuid.uuid4().hex[:6]}"
    elsewhere.mkdir()
    env = {"WORKER_BRIDGE_HOME": "/data"}
    sentence = (
        f"The state root /data is mounted from {elsewhere} on the host; mount it at the same "
        f"path: -v {elsewhere}:{elsewhere} and WORKER_BRIDGE_HOME={elsewhere}."
    )
    code, out, err = run_bridge(
        ["worker-bridge", "tasks", "list"], volumes={str(elsewhere): "/data"}, env=env
    )
    assert (code, err.strip()) == (2, f"worker-bridge: {sentence}")
    code, out, err = run_bridge(["worker-bridge-mcp"], volumes={str(elsewhere): "/data"}, env=env)
    assert (code, err.strip()) == (2, f"worker-bridge-mcp: {sentence}")
    code, out, err = run_bridge(
        ["worker-bridge", "doctor"], volumes={str(elsewhere): "/data"}, env=env
    )
    assert code == 1 and sentence in out, out

    # the state root shared, the repository mounted elsewhere: refused at creation
    code, out, err = run_bridge(
        ["worker-bridge", "tasks", "create", "--repo", "/repos/app", "--worker", "mock",
         "--objective", "x"],
        volumes={str(home): str(home), str(repo): "/repos/app"},
        env={"WORKER_BRIDGE_HOME": str(home)},
    )  # fmt: skip
    assert code == 2, (out, err)
    assert err.strip() == (
        f"worker-bridge: The repository /repos/app is mounted from {repo} on the host; mount it "
        f"at the same path: -v {repo}:{repo} and name it by its host path {repo}."
    )


def test_a_repository_on_another_filesystem_than_the_state_root(docker_images, cli, home, tmp_path):
    """The base commit's object pack is made under the state root, so git never renames it
    across filesystems (a repository on another disk, or in another bind mount)."""
    from support.repos import make_repo

    other = make_repo(tmp_path, "other-fs")
    if other.stat().st_dev == home.stat().st_dev:
        pytest.skip("the temporary folder and the state root are on one filesystem here")
    run = cli(
        "tasks", "run", "--repo", str(other), "--worker", "mock", "--objective", "x",
        "--metadata-json", json.dumps({"mock": {"write": {"a.txt": "x"}}}), "--json",
    )  # fmt: skip
    assert run.code == 0, run.json()["error"] if run.stdout else run.stderr
    assert run.json()["changed_files"] == [{"path": "a.txt", "change": "added"}]
