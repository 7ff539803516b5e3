"""Project environments through the real engine, on throwaway repositories whose dependencies come
from a package index the tests serve themselves (never a public registry): setup in its own phase
through the gateway, the cache and what keys it, the worker and verification inside the project's
image, and a worker trying to ship its own dependencies into verification."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.env_images import busybox_image
from support.env_specs import NPM_CI, ROUTE_KEY_VAR, kinds, node_spec, tarball_requests
from support.fake_mount import fake_mount
from support.projects import bump_dependency, python_project
from support.repos import commit_all, git, make_repo
from support.tasks import create_spec, mock_task, run_spec, task_events

pytestmark = pytest.mark.usefixtures("docker_images")

BUILD_DOCKERFILE = '{"build": {"dockerfile": "Dockerfile"}}'  # a devcontainer.json


# -- the Node project ---------------------------------------------------------------------------


def test_a_node_project_verifies_in_its_environment_once_set_up(
    cli, workdir, env, server, node_repo, env_image
):
    mock = {"script": "npm test > result.txt 2>&1; echo status $? >> result.txt"}

    first = run_spec(cli, workdir, node_spec(node_repo, env_image, mock), env)
    assert first["status"] == "succeeded", first["error"]
    verification = first["verification"]
    assert verification["ok"] is True
    assert "ok: wb-left-pad 1.0.0" in verification["commands"][0]["stdout_tail"]
    assert verification["environment"]["setup"] == "ran"
    # The worker ran the project's tests inside its container, with the dependencies set up.
    result = git(node_repo, "show", f"{first['branch']}:result.txt")
    assert "ok: wb-left-pad 1.0.0" in result and "status 0" in result
    log = task_events(cli, first["task_id"], env)
    setup = [e["data"] for e in log if e["kind"] == "environment.setup"]
    assert [s["status"] for s in setup] == ["started", "command", "completed"]
    assert setup[1]["command"] == NPM_CI and setup[1]["exit_code"] == 0
    assert any(e["kind"] == "environment.output" for e in log)
    assert any(e["kind"] == "network.request" for e in log)  # the setup's, through the gateway
    assert "setup_s" in first["timings"] and "environment_s" in first["timings"]
    fetched = tarball_requests(server)
    assert len(fetched) == 1
    # The setup's image keeps the project image's variables, not its container's (the proxy).
    from bridge.sandbox import DockerSandbox

    kept = DockerSandbox().inspect_image(verification["environment"]["image"])
    assert kept is not None and "HTTP_PROXY" not in kept.env and "PATH" in kept.env

    # The second task on the same base runs no setup: the cache is used, nothing is fetched.
    second = run_spec(cli, workdir, node_spec(node_repo, env_image), env)
    assert second["status"] == "succeeded", second["error"]
    assert second["verification"]["environment"]["setup"] == "cached"
    log = task_events(cli, second["task_id"], env)
    assert "environment.cached" in kinds(log) and "environment.setup" not in kinds(log)
    assert tarball_requests(server) == fetched

    # Without the environment, the generic verify image has no node: verification says so.
    plain = run_spec(cli, workdir, node_spec(node_repo, None), env)
    assert plain["status"] == "failed"
    assert plain["error"]["kind"] == "verification_failed"
    assert "npm: not found" in plain["verification"]["commands"][0]["stderr_tail"]

    # A changed lockfile on the base is a new key: setup runs again and fetches the new version.
    bump_dependency(node_repo, server, "1.1.0", write=True)
    third = run_spec(cli, workdir, node_spec(node_repo, env_image), env)
    assert third["status"] == "succeeded", third["error"]
    assert third["verification"]["environment"]["setup"] == "ran"
    assert "ok: wb-left-pad 1.1.0" in third["verification"]["commands"][0]["stdout_tail"]
    assert any("1.1.0.tgz" in r for r in tarball_requests(server))

    listed = json.loads(cli("environments", "list", "--json", env=env).stdout)
    assert len(listed) == 2 and all(item["state"] == "ready" for item in listed)
    assert all(item["key_files"] == ["package-lock.json", "package.json"] for item in listed)


def test_cached_files_are_linked_where_layering_them_is_refused_and_verification_says_so(
    home, workdir, env, node_repo, env_image, monkeypatch
):
    from bridge import WorkerBridge

    # Every mount over the environment's shared view fails: the worktree's and verification's
    # (each mounted again over the view), not the plain layered ones before them. The bridge
    # mounts in its own process: the task runs in this one, through the library.
    fake_mount(monkeypatch, "/bases/env/")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    mock = {"script": "npm test > result.txt 2>&1; echo status $? >> result.txt"}
    bridge = WorkerBridge(home=home)
    try:
        task_id = bridge.create_task(node_spec(node_repo, env_image, mock)).task_id
        done = bridge.run_task(task_id).document()
        log = [{"kind": e.kind, "data": e.data} for e in bridge.task_logs(task_id).events]
    finally:
        bridge.close()
    assert done["status"] == "succeeded", done["error"]
    assert "ok: wb-left-pad 1.0.0" in done["verification"]["commands"][0]["stdout_tail"]
    result = git(node_repo, "show", f"{done['branch']}:result.txt")
    assert "ok: wb-left-pad 1.0.0" in result and "status 0" in result  # linked for the worker
    assert [e["data"]["checkout"] for e in log if e["kind"] == "workspace.ready"] == ["layered"]
    assert "environment.outputs" not in kinds(log)  # linked one by one, not layered
    (checkout,) = [e["data"] for e in log if e["kind"] == "verification.checkout"]
    assert checkout["checkout"] == "full"
    assert "environment's files could not be layered" in checkout["fallback"]
    assert "refused by the test" in checkout["fallback"]


def test_a_python_project_with_a_dependency_the_verify_image_lacks(
    cli, workdir, env, server, env_image
):
    repo = python_project(workdir / "py", server)
    index = f"{server.url}/simple"
    install = (
        f"pip install --break-system-packages --no-cache-dir --index-url {index} "
        "--trusted-host localhost -r requirements.txt"
    )
    spec = mock_task(repo, {"write": {"note.txt": "hi\n"}}, verify=["python3 -m pytest -q"])
    plain = run_spec(cli, workdir, spec, env)
    assert plain["status"] == "failed"
    tail = plain["verification"]["commands"][0]["stdout_tail"]
    assert "No module named 'wbdep'" in tail

    # Installed outside the repository (the system's site-packages): kept in the setup's image.
    spec["environment"] = {"image": env_image, "setup": [install], "setup_network": ["localhost"]}
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    assert result["verification"]["environment"]["key"]
    assert "1 passed" in result["verification"]["commands"][0]["stdout_tail"]


# -- a hostile worker ---------------------------------------------------------------------------


def test_a_worker_that_changes_the_manifest_gets_setup_run_for_its_snapshot(
    cli, workdir, env, server, node_repo, env_image
):
    bumped = bump_dependency(node_repo, server, "2.0.0")  # published, not committed
    # The snapshot's setup runs the worker's files: it reaches only what the task may reach.
    network = {"mode": "allowlist", "domains": ["localhost"]}
    spec = node_spec(node_repo, env_image, {"write": bumped}, network=network)
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "succeeded", result["error"]
    environment = result["verification"]["environment"]
    assert environment["setup"] == "ran_for_snapshot"
    assert environment["changed_files"] == ["package-lock.json", "package.json"]
    assert "ok: wb-left-pad 2.0.0" in result["verification"]["commands"][0]["stdout_tail"]
    log = task_events(cli, result["task_id"], env)
    reasons = [
        e["data"]["reason"]
        for e in log
        if e["kind"] == "environment.setup" and e["data"]["status"] == "started"
    ]
    assert len(reasons) == 2 and "the worker changed package-lock.json" in reasons[1]
    # What the worker's files made is the task's own: not in the shared cache, and gone after.
    listed = json.loads(cli("environments", "list", "--json", env=env).stdout)
    assert len(listed) == 1
    assert not (workdir / "home" / "tasks" / result["task_id"] / "environments").exists()
    from bridge.sandbox import DockerSandbox

    tags = [t for i in DockerSandbox().images({}) for t in i.tags if result["task_id"] in t]
    assert tags == []


def test_node_modules_the_worker_fakes_never_reach_verification_nor_the_cache(
    cli, workdir, env, node_repo, env_image
):
    fake = "module.exports = () => 'FAKE'; module.exports.VERSION = 'fake';\n"
    script = (
        # Writing through to the cache's file is refused (it is the host's, read-only) ...
        "if echo tampered >> node_modules/wb-left-pad/index.js; then echo WROTE > wrote.txt; fi;"
        # ... replacing it in the worktree works, and so does a whole fake package.
        "rm -rf node_modules/wb-left-pad && mkdir -p node_modules/wb-left-pad"
        f' && printf %s "{fake}" > node_modules/wb-left-pad/index.js'
        " && mkdir -p node_modules/evil && echo 'x' > node_modules/evil/index.js"
        " && npm test > result.txt 2>&1; echo status $? >> result.txt"
    )
    result = run_spec(cli, workdir, node_spec(node_repo, env_image, {"script": script}), env)
    assert result["status"] == "succeeded", result["error"]
    branch = result["branch"]
    assert "status 1" in git(node_repo, "show", f"{branch}:result.txt")  # the fake broke its run
    assert git(node_repo, "show", f"{branch}:wrote.txt", check=False) == ""
    assert not any(c["path"].startswith("node_modules") for c in result["changed_files"])
    # Verification ran on the snapshot plus the cached setup output, not the worker's files.
    assert "ok: wb-left-pad 1.0.0" in result["verification"]["commands"][0]["stdout_tail"]
    # The cache entry is whole: the next task trusts it (no corrupt entry, no setup run).
    again = run_spec(cli, workdir, node_spec(node_repo, env_image), env)
    log = kinds(task_events(cli, again["task_id"], env))
    assert "environment.cached" in log and "environment.cache_corrupt" not in log
    assert again["verification"]["ok"] is True


# -- devcontainer.json ----------------------------------------------------------------------


def _commit_devcontainer(repo: Path, config: str, dockerfile: str | None = None) -> None:
    """REPO's .devcontainer/devcontainer.json (and its Dockerfile), committed."""
    folder = repo / ".devcontainer"
    folder.mkdir()
    if dockerfile is not None:
        (folder / "Dockerfile").write_text(dockerfile)
    (folder / "devcontainer.json").write_text(config)
    commit_all(repo, "devcontainer")


def test_a_devcontainer_with_an_image_and_a_post_create_command_is_honoured(
    cli, workdir, env, node_repo, env_image
):
    (node_repo / ".gitignore").write_text("node_modules/\n.created\n")
    _commit_devcontainer(
        node_repo,
        "{\n  // the project's own environment\n"
        f'  "image": "{env_image}",\n'
        '  "containerEnv": {"WB_DEMO": "from-devcontainer"},\n'
        f'  "postCreateCommand": ["sh", "-c", "{NPM_CI} && touch .created"],\n'
        '  "customizations": {"vscode": {"extensions": ["x.y"]}},\n'
        "}\n",
    )
    spec = node_spec(node_repo, None)
    spec["verification"]["commands"] = [
        'npm test && test -f .created && test "$WB_DEMO" = from-devcontainer'
    ]
    spec["environment"] = {"devcontainer": True, "setup_network": ["localhost"]}
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["environment"]["source"] == (
        "devcontainer .devcontainer/devcontainer.json"
    )


def test_a_devcontainer_dockerfile_is_built_from_the_base_commit(
    cli, workdir, env, node_repo, env_image
):
    _commit_devcontainer(
        node_repo,
        json.dumps({"build": {"dockerfile": "Dockerfile", "args": {"GREETING": "built"}}}),
        f'FROM {env_image}\nARG GREETING\nRUN echo "$GREETING" > /etc/wb-built\n',
    )
    spec = mock_task(
        node_repo, {"write": {"note.txt": "x\n"}}, verify=["grep -qx built /etc/wb-built"]
    )
    spec["environment"] = {"devcontainer": True}
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["environment"]["setup"] == "none"
    assert result["verification"]["environment"]["image"].startswith("worker-bridge-env-build:")
    log = kinds(task_events(cli, result["task_id"], env))
    assert "environment.build" in log and "environment.built" in log


# -- the setup's network and credentials ------------------------------------------------------


def test_setup_reaches_only_its_setup_network_and_holds_no_credential(
    cli, workdir, env, server, node_repo, env_image
):
    probe = (
        "python3 - <<'EOF'\n"
        "import json, os, socket, urllib.request\n"
        "out = {'env': dict(os.environ)}\n"
        "def get(url):\n"
        "    try:\n"
        "        return urllib.request.urlopen(url, timeout=20).status\n"
        "    except Exception as exc:\n"
        "        return str(exc)\n"
        f"out['listed'] = get('{server.url}/wb-left-pad')\n"
        "out['unlisted'] = get('http://example.com/')\n"
        "try:\n"
        "    socket.create_connection(('93.184.216.34', 80), timeout=5); out['direct'] = 'open'\n"
        "except OSError as exc:\n"
        "    out['direct'] = exc.__class__.__name__\n"
        "open('.probe.json', 'w').write(json.dumps(out))\n"
        "EOF"
    )
    (node_repo / ".gitignore").write_text("node_modules/\n.probe.json\n")
    commit_all(node_repo, "ignore the probe")
    spec = node_spec(node_repo, env_image, {"script": "cat .probe.json"}, network={"mode": "none"})
    spec["environment"]["setup"] = [probe]
    spec["metadata"]["mock"]["routes"] = ["test"]  # the worker has a keyed route; setup none
    result = run_spec(cli, workdir, spec, env)
    assert result["task_id"], result
    entry = next((workdir / "home" / "environments").glob("[0-9a-f]*"))
    out = json.loads((entry / "outputs" / ".probe.json").read_text())
    assert out["listed"] == 200
    assert "403" in out["unlisted"]
    assert (
        out["direct"] in ("OSError", "ConnectionRefusedError", "TimeoutError")
        or "Errno" in out["direct"]
    )
    assert not any(env[ROUTE_KEY_VAR] in str(v) for v in out["env"].values())
    assert not any(k.startswith("WB_ROUTE") for k in out["env"])
    log = task_events(cli, result["task_id"], env)
    refused = [e["data"] for e in log if e["kind"] == "network.refused"]
    assert any(r.get("host") == "example.com" for r in refused)


# -- bad input ----------------------------------------------------------------------------------


def test_bad_environments_are_refused_at_creation_naming_what_is_wrong(
    cli, workdir, env, repo, env_image
):
    def refused(environment) -> str:
        spec = mock_task(repo, {}, verify=["true"])
        spec["environment"] = environment
        res = create_spec(cli, workdir, spec, env)
        assert res.code == 2, res.stdout + res.stderr
        return res.stderr

    assert "Unknown key 'environment.foo'" in refused({"image": env_image, "foo": 1})
    missing = refused({"image": "worker-bridge-test/no-such-image:1"})
    assert "no-such-image:1 is not present" in missing and "docker load" in missing
    assert "allowed_images" in refused({"image": "wb-not-allowed:1"})
    assert "devcontainer.json" in refused({"devcontainer": True})
    assert "names no image" in refused({"setup": ["true"]})
    assert "setup_network" in refused({"image": env_image, "setup_network": ["http://x/"]})
    assert "cache_key_files" in refused({"image": env_image, "cache_key_files": ["nope.lock"]})
    (repo / ".devcontainer.json").write_text(json.dumps({"image": env_image, "features": {}}))
    commit_all(repo, "features")
    assert "`features`" in refused({"devcontainer": True})
    both = mock_task(repo, {}, verify=["true"])
    both["verification"]["image"] = env_image
    both["environment"] = {"image": env_image}
    res = create_spec(cli, workdir, both, env)
    assert res.code == 2 and "verification.image" in res.stderr
    assert json.loads(cli("tasks", "list", "--json", env=env).stdout)["tasks"] == []


def _no_leftovers(workdir: Path, task_id: str) -> None:
    from bridge.sandbox import DockerSandbox, home_id

    home = workdir / "home"
    sandbox = DockerSandbox()
    assert sandbox.containers({"io.worker-bridge.home": home_id(home)}) == []
    root = home / "environments"
    assert (
        not root.exists() or [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []
    )
    kept = sandbox.images(
        {"io.worker-bridge.home": home_id(home), "io.worker-bridge.role": "environment"}
    )
    assert [i.tags for i in kept if any(t.startswith("worker-bridge-env:") for t in i.tags)] == []
    assert not list((home / "tasks" / task_id).glob("setup-*"))


def _failed_in(cli, workdir: Path, env: dict, repo: Path, environment: dict) -> str:
    """A mock task in ENVIRONMENT, run to its end: it fails as an environment error and leaves
    nothing behind; the error's message."""
    spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["true"])
    spec["environment"] = environment
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "environment", result["error"]
    _no_leftovers(workdir, result["task_id"])
    return result["error"]["message"]


def test_a_failing_setup_ends_the_task_with_its_tail_and_leaves_nothing(
    cli, workdir, env, repo, env_image
):
    setup = ["touch /made", "echo broken >&2; exit 3"]
    message = _failed_in(cli, workdir, env, repo, {"image": env_image, "setup": setup})
    assert "`echo broken >&2; exit 3` exited with status 3" in message and "broken" in message


def test_a_setup_past_its_deadline_is_stopped(cli, workdir, env, repo, env_image):
    environment = {"image": env_image, "setup": ["sleep 60"], "setup_timeout_seconds": 2}
    assert "did not finish within 2 s" in _failed_in(cli, workdir, env, repo, environment)


def test_a_dockerfile_that_fails_to_build_names_its_step(cli, workdir, env, repo, env_image):
    _commit_devcontainer(repo, BUILD_DOCKERFILE, f"FROM {env_image}\nRUN exit 7\n")
    assert "RUN exit 7" in _failed_in(cli, workdir, env, repo, {"devcontainer": True})


def test_an_image_without_glibc_is_refused_with_that_reason(cli, workdir, env, repo):
    from support.engine import BASE_IMAGE

    from bridge.sandbox import DockerSandbox

    image = busybox_image(DockerSandbox(), BASE_IMAGE)
    assert "no glibc" in _failed_in(cli, workdir, env, repo, {"image": image})


def test_a_corrupt_cache_entry_is_rebuilt_not_trusted(cli, workdir, env, node_repo, env_image):
    first = run_spec(cli, workdir, node_spec(node_repo, env_image), env)
    assert first["status"] == "succeeded", first["error"]
    entry = next((workdir / "home" / "environments").glob("[0-9a-f]*"))
    planted = entry / "outputs" / "node_modules" / "wb-left-pad" / "index.js"
    planted.chmod(0o644)
    planted.write_text("module.exports = () => 'POISONED';\n")
    second = run_spec(cli, workdir, node_spec(node_repo, env_image), env)
    assert second["status"] == "succeeded", second["error"]
    log = task_events(cli, second["task_id"], env)
    corrupt = [e["data"] for e in log if e["kind"] == "environment.cache_corrupt"]
    assert corrupt and "changed" in corrupt[0]["reason"]
    assert second["verification"]["environment"]["setup"] == "ran"
    assert "ok: wb-left-pad 1.0.0" in second["verification"]["commands"][0]["stdout_tail"]
    # An unreadable record is not trusted either.
    (entry / "entry.json").write_text("{not json")
    third = run_spec(cli, workdir, node_spec(node_repo, env_image), env)
    assert third["verification"]["environment"]["setup"] == "ran"


def test_a_sealed_entry_is_checked_by_its_image_and_a_changed_image_is_never_trusted(
    cli, workdir, env, node_repo, env_image
):
    from bridge.environments import sealed

    if not sealed.sealing_available():
        pytest.skip("needs mkfs.erofs and the kernel's erofs (CI requires them)")
    spec = node_spec(node_repo, env_image)
    entries = workdir / "home" / "environments"

    def run(spec: dict) -> tuple[dict, list[dict]]:
        done = run_spec(cli, workdir, spec, env)
        assert done["status"] == "succeeded", done["error"]
        for command in done["verification"]["commands"]:
            assert "ok: wb-left-pad 1.0.0" in command["stdout_tail"], command
        return done, task_events(cli, done["task_id"], env)

    def poison_outputs() -> None:
        planted = next(entries.glob("[0-9a-f]*")) / "outputs/node_modules/wb-left-pad/index.js"
        planted.chmod(0o644)
        planted.write_text("module.exports = () => 'POISONED';\n")

    def cached(log: list[dict]) -> dict:
        return next(e["data"] for e in log if e["kind"] == "environment.cached")

    def corrupt(log: list[dict]) -> list[str]:
        return [e["data"]["reason"] for e in log if e["kind"] == "environment.cache_corrupt"]

    run(spec)  # set up
    _, log = run(spec)  # checked whole, then sealed
    assert cached(log)["sealed"] is False
    # Two verification commands: the second's full checkout links the entry's own files, so
    # they are checked whole even for a sealed task, and the poison is caught.
    poison_outputs()
    two = {**spec, "verification": {"commands": ["npm test", "npm test"]}}
    done, log = run(two)
    assert cached(log)["sealed"] is True
    assert corrupt(log) and "changed since it was made" in corrupt(log)[0]
    assert done["verification"]["environment"]["setup"] == "ran"
    run(spec)  # the entry made again: checked whole, then sealed
    # The entry's own files poisoned after sealing: what the sealed view holds is what the
    # check passed, so nothing poisoned reaches the worker or verification.
    poison_outputs()
    mock = {"script": "npm test > result.txt 2>&1; echo status $? >> result.txt"}
    done, log = run({**spec, "metadata": {"mock": mock}})
    assert cached(log)["sealed"] is True and not corrupt(log)
    assert [e["data"] for e in log if e["kind"] == "environment.outputs"] == [
        {"files": "layered", "sealed": True}
    ]
    assert "ok: wb-left-pad 1.0.0" in git(node_repo, "show", f"{done['branch']}:result.txt")
    # The sealed image itself changed (the same bytes written again: only its change time
    # tells): the entry is not trusted, and set up again.
    images = (workdir / "home" / "bases" / "env").glob(f"*/{sealed.IMAGE}")
    image = max(images, key=lambda p: p.stat().st_mtime)  # the entry made again's
    with image.open("r+b") as f:
        f.write(f.read(4096))
    done, log = run(spec)
    assert corrupt(log) and "sealed image changed" in corrupt(log)[0]
    assert done["verification"]["environment"]["setup"] == "ran"


def test_environments_prune_reclaims_entries_and_their_images(
    cli, workdir, env, node_repo, env_image
):
    assert run_spec(cli, workdir, node_spec(node_repo, env_image), env)["status"] == "succeeded"
    listed = json.loads(cli("environments", "list", "--json", env=env).stdout)
    image = listed[0]["image"]
    dry = json.loads(cli("environments", "prune", "--json", env=env).stdout)
    assert dry["actions"] == []  # just used, and the disk has room
    tight = {**env, "WORKER_BRIDGE_DISK_RESERVE_GB": "100000"}  # the disk is "full"
    dry = json.loads(cli("environments", "prune", "--json", env=tight).stdout)
    assert [a["reason"] for a in dry["actions"]] == ["free disk is below the reserve"]
    dry = json.loads(cli("environments", "prune", "--all", "--json", env=env).stdout)
    assert [a["kind"] for a in dry["actions"]] == ["entry"] and not dry["applied"]
    done = cli("environments", "prune", "--all", "--apply", env=env)
    assert done.code == 0 and "removed entry" in done.stdout
    assert json.loads(cli("environments", "list", "--json", env=env).stdout) == []
    from bridge.sandbox import DockerSandbox

    assert DockerSandbox().inspect_image(image) is None


def test_accept_after_head_moved_reverifies_in_the_environment(
    cli, workdir, env, server, node_repo, env_image
):
    result = run_spec(cli, workdir, node_spec(node_repo, env_image), env)
    assert result["status"] == "succeeded", result["error"]
    # The user moves on meanwhile, to a new dependency version: accept re-verifies the merged
    # tree in the environment, with setup for its (changed) lockfile.
    bump_dependency(node_repo, server, "1.2.0", write=True)
    accepted = cli("tasks", "accept", result["task_id"], "--json", env=env, timeout=300)
    assert accepted.code == 0, accepted.stdout + accepted.stderr
    document = accepted.json()
    assert document["accepted"] is True and document["reverified"] is True
    log = task_events(cli, result["task_id"], env)
    reverifying = [e["data"] for e in log if e["kind"] == "accept.reverifying"]
    assert reverifying[0]["image"].startswith("worker-bridge-env:")
    assert [e["data"]["ok"] for e in log if e["kind"] == "accept.reverified"] == [True]
    assert (node_repo / "note.txt").read_text() == "hi\n"
    assert not (workdir / "home" / "tasks" / result["task_id"] / "environments").exists()


def test_a_repository_default_from_config_applies_when_the_spec_names_none(
    cli, workdir, env, home, repo, env_image
):
    config = (home / "config.yaml").read_text()
    (home / "config.yaml").write_text(
        config + f"environments:\n  {json.dumps(str(repo))}:\n    image: {env_image}\n"
    )
    spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["node --version"])
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["environment"]["source"] == f"image {env_image}"
    other = make_repo(workdir, "other")  # another repository keeps the generic image
    plain = run_spec(
        cli, workdir, mock_task(other, {"write": {"a.txt": "a\n"}}, verify=["node -v"]), env
    )
    assert plain["status"] == "failed" and plain["verification"]["environment"] is None


def test_a_dockerfile_build_past_its_deadline_is_stopped(cli, workdir, env, repo, env_image):
    _commit_devcontainer(repo, BUILD_DOCKERFILE, f"FROM {env_image}\nRUN sleep 40\n")
    message = _failed_in(
        cli, workdir, env, repo, {"devcontainer": True, "setup_timeout_seconds": 3}
    )
    assert "RUN sleep 40" in message, message
    assert "no output for" in message or "within" in message
