"""gVisor (`runtime: runsc`): a task's worker reaches its gateway through the bind-mounted Unix
socket and verification runs, all inside gVisor; a runtime that is missing or lacks what the
gateway needs is refused before anything runs, never replaced by a weaker one. The engine tests
need runsc registered (CI registers it: .ci/run); WORKER_BRIDGE_REQUIRE_RUNSC=1 makes a missing
one a failure rather than a skip."""

from __future__ import annotations

import json
import os

import pytest
from support.repos import git
from support.tasks import mock_task, write_spec
from support.upstream import Upstream

from bridge import WorkerBridge
from bridge.sandbox.fake import FakeSandbox
from bridge.sandbox.runtimes import runtime_check

KEY = "sk-gvisor-" + os.urandom(8).hex()


@pytest.fixture
def runsc(docker_images):
    from bridge.sandbox.docker import DockerSandbox

    registered = DockerSandbox().runtimes()
    usable, why = runtime_check("runsc", registered)
    if not usable:
        if os.environ.get("WORKER_BRIDGE_REQUIRE_RUNSC") == "1":
            pytest.fail(f"WORKER_BRIDGE_REQUIRE_RUNSC=1 but: {why}")
        pytest.skip(why)
    return registered["runsc"]


def test_a_task_with_a_model_route_runs_and_verifies_under_gvisor(cli, repo, workdir, home, runsc):
    upstream = Upstream().start()
    try:
        (home / "config.yaml").write_text(
            "runtime: runsc\nallow_mock_routes: true\n"
            "gateway:\n  routes:\n    test:\n"
            f"      upstream: {upstream.url}\n      auth: x-api-key\n      key_env: WB_GV_KEY\n"
        )
        script = (
            "python3 -c \"import os, urllib.request, urllib.error; open('out.txt', 'wb').write("
            "urllib.request.urlopen(os.environ['WB_ROUTE_TEST'] + '/v1/x').read());"
            " open('net.txt', 'w').write(open('/proc/net/dev').read());\n"
            "try: urllib.request.urlopen('http://127.0.0.1:7800/nope/x')\n"
            "except urllib.error.HTTPError as e:"
            " open('bad.txt', 'w').write(f'{e.code} {e.read()}')\""
        )
        spec = mock_task(repo, {"routes": ["test"], "script": script}, verify=["test -s out.txt"])
        path = write_spec(workdir / "s.json", spec)
        run = cli("tasks", "run", "--spec", str(path), "--json", env={"WB_GV_KEY": KEY})
        result = run.json()
        assert result["status"] == "succeeded", result["error"]
        assert result["verification"]["ok"] is True
        assert '"path": "/v1/x"' in git(repo, "show", f"{result['branch']}:out.txt")
        interfaces = git(repo, "show", f"{result['branch']}:net.txt").splitlines()[2:]
        assert [line.split(":")[0].strip() for line in interfaces] == ["lo"]
        assert upstream.requests[-1].headers["x-api-key"] == KEY
        bad = git(repo, "show", f"{result['branch']}:bad.txt")
        assert bad.startswith("404") and "no gateway route 'nope'" in bad  # bad input, in gVisor
        doctor = cli("doctor", "--json")
        checks = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}
        assert checks["runtime"]["ok"] is True
    finally:
        upstream.stop()


@pytest.mark.parametrize(
    ("registered", "needle"),
    [({}, "not registered"), ({"runsc": []}, "--host-uds=open")],
)
def test_a_runtime_that_cannot_run_the_task_is_refused_before_anything_runs(
    home, repo, registered, needle
):
    sandbox = FakeSandbox(runtimes=())
    sandbox.runtimes = lambda: registered  # type: ignore[method-assign]
    bridge = WorkerBridge(home=home, sandbox=sandbox, runtime="runsc")
    result = bridge.run_task(bridge.create_task(mock_task(repo, {"write": {"a": "a"}})).task_id)
    assert result.status == "failed" and result.error.kind == "sandbox"
    assert needle in result.error.message
    assert sandbox.started == []  # nothing ran, under any runtime
    bridge.close()


def test_a_real_cli_works_resumes_and_verifies_under_gvisor(cli, repo, workdir, home, runsc):
    """Codex, the real binary, in gVisor: its model route through the gateway's socket, its
    session resumed on a follow-up from its home, and the verification, all under runsc."""
    from support.real_workers import KEY as REAL_KEY
    from support.real_workers import KEY_VARS, ensure_worker_image
    from support.tasks import run_spec

    from bridge.config.settings import load_config
    from bridge.smoke.model_server import ModelServer

    ensure_worker_image(load_config({"WORKER_BRIDGE_HOME": str(home)}), "codex")
    server = ModelServer(key=REAL_KEY).start()
    try:
        (home / "config.yaml").write_text(
            "runtime: runsc\ngateway:\n  routes:\n    openai:\n"
            f"      upstream: {server.url}\n      key_env: {KEY_VARS['openai']}\n"
        )
        env = {KEY_VARS["openai"]: REAL_KEY}
        objective = (
            "Write it.\n@write gv.txt: from gvisor\n@follow-write gv.txt: again from gvisor\n"
            "@say Done."
        )
        spec = {
            "objective": objective,
            "worker": "codex",
            "workspace": {"repository": str(repo)},
            "verification": {"commands": ["grep -q gvisor gv.txt"]},
        }
        result = run_spec(cli, workdir, spec, env)
        assert result["status"] == "succeeded", result["error"]
        assert result["verification"]["ok"] is True and result["session_id"]
        follow = cli("tasks", "follow-up", result["task_id"], "More.", "--wait", "--json", env=env)
        after = follow.json()
        assert after["status"] == "succeeded", after["error"]
        assert after["session_id"] == result["session_id"]
        assert git(repo, "show", f"{after['branch']}:gv.txt").strip() == "again from gvisor"
    finally:
        server.stop()
