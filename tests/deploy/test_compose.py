"""compose/compose.yaml with the compose tool here (Debian's docker-compose 1.29): it validates,
comes up with a temporary token file and state root, passes its healthcheck, serves a mock task
through the HTTP endpoint (the Python SDK's streamable HTTP client: delegate, poll, accept) and
refuses a request without the token, and `down -v` leaves no container or network behind."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from support.engine import REQUIRE_DOCKER
from support.mcp_http_server import free_port, http_client
from support.mcp_session import call, delegate, wait_status
from support.waiting import poll

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose" / "compose.yaml"
PROJECT_LABEL = "com.docker.compose.project"
COMPOSE = shutil.which("docker-compose")


@pytest.fixture(autouse=True)
def compose_tool():
    if COMPOSE is None:
        why = "docker-compose is not installed; `make test-deps` installs it (Debian's package)"
        if REQUIRE_DOCKER:
            pytest.fail(why)
        pytest.skip(why)


def compose(project: str, env: dict[str, str], *args: str, timeout: float = 600):
    proc = subprocess.run(
        [COMPOSE, "-p", project, "-f", str(COMPOSE_FILE), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"docker-compose {' '.join(args)}: {proc.stderr[-3000:]}"
    return proc.stdout


@dataclass
class Deployment:
    project: str
    env: dict[str, str]
    url: str
    token: str


def settings(workdir: Path, home: Path) -> tuple[dict[str, str], str]:
    token = secrets.token_hex(32)
    token_file = workdir / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    env = {
        "WORKER_BRIDGE_HOME": str(home),
        "WORKER_BRIDGE_REPOS": str(workdir / "repo"),
        "WORKER_BRIDGE_TOKEN_FILE": str(token_file),
        "WORKER_BRIDGE_PORT": str(free_port()),
    }
    return env, token


def test_the_compose_file_validates(workdir, home):
    env, _ = settings(workdir, home)
    rendered = compose(f"wbcfg{uuid.uuid4().hex[:8]}", env, "config")
    assert f"{home}:{home}" in rendered  # the state root at the same path
    assert f"127.0.0.1:{env['WORKER_BRIDGE_PORT']}:8765" in rendered  # loopback by default


@pytest.fixture
def deployment(docker_images, workdir, home, repo) -> Iterator[Deployment]:
    """The compose project up and healthy; torn down with `down -v`, which must leave nothing."""
    import docker

    env, token = settings(workdir, home)
    env["WORKER_BRIDGE_BASE_IMAGE"] = docker_images.image_for("base")
    project = f"wbtest{uuid.uuid4().hex[:10]}"
    client = docker.from_env()
    label = {"label": f"{PROJECT_LABEL}={project}"}
    try:
        started = time.monotonic()
        compose(project, env, "up", "-d", "--build")
        print(f"compose up --build in {time.monotonic() - started:.1f} s")

        def health() -> bool:
            found = client.containers.list(all=True, filters=label)
            assert len(found) == 1, found
            state = found[0].attrs["State"]
            assert state["Status"] in ("created", "running"), (state, found[0].logs()[-2000:])
            return state.get("Health", {}).get("Status") == "healthy"

        poll(health, "the bridge's healthcheck", deadline_s=90)
        print(f"healthy {time.monotonic() - started:.1f} s after up")
        url = f"http://127.0.0.1:{env['WORKER_BRIDGE_PORT']}"
        yield Deployment(project, env, url, token)
    finally:
        compose(project, env, "down", "-v", "--remove-orphans")
        left = client.containers.list(all=True, filters=label)
        networks = client.networks.list(filters=label)
        for container in left:  # only if down failed to: by id, ours alone
            container.remove(force=True)
        client.close()
        assert left == [] and networks == [], (left, networks)


@pytest.mark.anyio
async def test_compose_comes_up_healthy_and_serves_a_task_over_http(deployment, repo):
    health = httpx2.get(f"{deployment.url}/healthz", timeout=5)
    assert health.status_code == 200 and health.json()["ok"] is True
    refused = httpx2.post(
        f"{deployment.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    )
    assert refused.status_code == 401, refused.text

    async with http_client(deployment.url, deployment.token) as client:
        mock = {"write": {"hello.txt": "hello from the container\n"}}
        queued = await delegate(client, repo, mock, verify=["test -f hello.txt"])
        done = await wait_status(client, queued["task_id"], deadline_s=120)
        assert done["status"] == "succeeded", (done["error"], done)
        assert done["verification"]["ok"] is True, done
        accepted = await call(client, "worker_accept", {"task_id": queued["task_id"]})
    assert accepted["accepted"] is True, accepted
    # accepted from inside the container into the host's repository, at the same path
    assert (repo / "hello.txt").read_text() == "hello from the container\n"
