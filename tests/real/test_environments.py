"""The real CLIs inside a project's own image: each worker's bundle (its native binary and the
relay) mounted read-only into a plain Debian image with Node.js and nothing of worker-bridge,
reaching the scripted model server through the task's gateway; the file it writes is verified
in the same environment, with the dependencies its setup installed."""

from __future__ import annotations

import pytest
from support.env_images import node_image
from support.projects import node_project
from support.real_workers import assert_key_nowhere, ensure_worker_image
from support.registries import PackageServer
from support.repos import git
from support.tasks import run_spec, task_events

pytestmark = pytest.mark.usefixtures("docker_images")


@pytest.mark.parametrize("worker", ["claude-code", "codex", "opencode"])
def test_a_real_cli_works_inside_the_project_environment(
    cli,
    workdir,
    home,
    worker,
    model_server,
    real_env,
):
    from support.engine import BASE_IMAGE

    from bridge.config.settings import load_config
    from bridge.sandbox import DockerSandbox

    image = node_image(DockerSandbox(), BASE_IMAGE)
    ensure_worker_image(load_config({"WORKER_BRIDGE_HOME": str(home)}), worker)
    with PackageServer() as server:
        # real_env's routes to the scripted model, and the registry on loopback for setup.
        with (home / "config.yaml").open("a") as config:
            config.write(f"  trusted_ranges: ['127.0.0.0/8']\n  http_ports: [{server.port}]\n")
            config.write("allowed_images: ['worker-bridge-test/*']\n")
        env = real_env
        repo = node_project(workdir / "node", server)
        spec = {
            "objective": (
                "Add a note.\n@write NOTE.md: written inside the project's image\n@say Done."
            ),
            "worker": worker,
            "workspace": {"repository": str(repo)},
            "verification": {"commands": ["npm test && grep -q 'project' NOTE.md"]},
            "environment": {
                "image": image,
                "setup": ["npm ci --no-audit --no-fund"],
                "setup_network": ["localhost"],
            },
        }
        result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["environment"]["image"].startswith("worker-bridge-env:")
    assert "ok: wb-left-pad 1.0.0" in result["verification"]["commands"][0]["stdout_tail"]
    assert git(repo, "show", f"{result['branch']}:NOTE.md").strip() == (
        "written inside the project's image"
    )
    assert result["summary"] == "Done."
    started = task_events(cli, result["task_id"], env, "worker.started")
    assert len(started) == 1
    assert_key_nowhere(home)
    # Only the setup's registry requests were proxied; the CLI itself reached only its route.
    refused = task_events(cli, result["task_id"], env, "network.refused")
    assert refused == [], refused
    assert model_server.unexpected() == []
