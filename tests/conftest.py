"""The suite's fixtures and hooks (the helpers they use live in tests/support/): a throwaway
state root and repository per test (on /dev/shm when present), the CLI as a subprocess, the
image set built once per session, the engine required by every `docker` test (and what its state
root started there removed), and the servers several test files share: the test upstream, the
package index, the scripted model server, and the MCP server's token."""

from __future__ import annotations

import os
import secrets
import uuid
from pathlib import Path

import pytest
from support.cli import cli_runner
from support.engine import BASE_IMAGE, remove_home_artifacts, require_engine
from support.env_specs import ROUTE_KEY, ROUTE_KEY_VAR, registry_config
from support.mcp_session import cancel_unfinished
from support.projects import node_project
from support.real_workers import KEY, model_config
from support.registries import PackageServer
from support.repos import calc_repo
from support.scratch import TEST_ROOT
from support.upstream import Upstream

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")


# Fixtures that reach the engine: a test using one is marked `docker` for it. A test that reaches
# the engine another way (docker-py or the docker CLI, a WorkerBridge or worker-bridge command that
# runs a task, compose...) carries the mark in its file. `make test-fast` (-m "not docker") runs
# with DOCKER_HOST on a dead socket, so a test that reaches the engine unmarked fails there.
ENGINE_FIXTURES = {"docker_images", "env_image"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.docker)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A `docker` test without an engine is skipped, or failed under
    WORKER_BRIDGE_REQUIRE_DOCKER=1, before any of its fixtures starts."""
    if item.get_closest_marker("docker") is not None:
        require_engine()


# -- a test's own folders and the ways in ------------------------------------------------------


@pytest.fixture
def workdir(request):
    """A private folder for one test (state root, repository, scratch)."""
    base = TEST_ROOT or Path(request.config._tmp_path_factory.getbasetemp())
    path = base / f"wb-test-{uuid.uuid4().hex[:10]}"
    path.mkdir(parents=True)
    yield path
    if request.node.get_closest_marker("docker") is not None:
        remove_home_artifacts(path / "home")  # only a test that reaches the engine leaves any
    from bridge.workspace.fs import remove_tree  # any depth, never following a link
    from bridge.workspace.overlay import unmount_under
    from bridge.workspace.trash import reap

    reap(path / "home")  # after the state root's background remover, never beside it
    unmount_under(path)  # layered worktrees of any state root here (tasks not pruned)
    remove_tree(path)


@pytest.fixture
def home(workdir: Path) -> Path:
    """The test's state root, private as the bridge makes one (0700)."""
    path = workdir / "home"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def repo(workdir: Path) -> Path:
    """A small committed repository: a module, its test, a .gitignore."""
    return calc_repo(workdir / "repo")


@pytest.fixture
def cli(home: Path):
    """Run `worker-bridge ...` as a subprocess against the test's state root."""
    return cli_runner(home)


@pytest.fixture
def bridge(home: Path):
    from bridge import WorkerBridge

    instance = WorkerBridge(home=home)
    yield instance
    instance.close()


@pytest.fixture(scope="session")
def docker_images():
    """The engine is reachable and the image set (base, mock, verify) is built."""
    from bridge.config.settings import load_config
    from bridge.sandbox import DockerSandbox
    from bridge.sandbox.images import build_images

    require_engine()
    sandbox = DockerSandbox()
    env = {"WORKER_BRIDGE_HOME": "/nonexistent-wb-home"}
    if os.environ.get("WORKER_BRIDGE_EXTRA_CA_FILE"):  # `make test` passes the host's CA bundle
        env["WORKER_BRIDGE_EXTRA_CA_FILE"] = os.environ["WORKER_BRIDGE_EXTRA_CA_FILE"]
    config = load_config(env=env)
    wanted = [config.image_for("mock"), config.verify_image_ref]
    if not all(sandbox.image_present(ref) for ref in wanted):
        build_images(
            config, sandbox, ["base", "verify", "mock"], BASE_IMAGE, on_line=lambda _: None
        )
    return config


# -- the MCP server ----------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def token() -> str:
    return secrets.token_hex(24)


@pytest.fixture
def token_file(workdir: Path, token: str) -> Path:
    path = workdir / "mcp-token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def no_task_outlives_the_test(home: Path):
    """Detached runners outlive the server that spawned them: on the way out (also on failure)
    cancel every unfinished task of this state root, which kills its containers."""
    yield
    cancel_unfinished(home)


# -- servers on loopback -----------------------------------------------------------------------


@pytest.fixture
def upstream():
    """The gateway tests' HTTP upstream (support/upstream.py)."""
    server = Upstream().start()
    yield server
    server.stop()


@pytest.fixture
def server():
    """The tests' own package index (npm and PyPI, support/registries.py)."""
    with PackageServer() as running:
        yield running


@pytest.fixture
def model_server():
    """The scripted model server, every provider's API, answering only the real-worker key."""
    from bridge.smoke.model_server import ModelServer

    running = ModelServer(key=KEY).start()
    yield running
    running.stop()


# -- config.yaml for a kind of test ------------------------------------------------------------


@pytest.fixture
def env(home: Path, server: PackageServer) -> dict[str, str]:
    """config.yaml letting the gateway reach the package server on loopback; a route key in
    the CLI's environment (which no setup may see)."""
    (home / "config.yaml").write_text(registry_config(server))
    return {ROUTE_KEY_VAR: ROUTE_KEY}


@pytest.fixture
def node_repo(workdir: Path, server: PackageServer) -> Path:
    """The generated Node project (support/projects.py), committed, its dependency on the
    package server."""
    return node_project(workdir / "node", server)


@pytest.fixture(scope="module")
def env_image() -> str:
    """The environment tests' Node image (support/env_images.py), built once per engine."""
    from support.env_images import node_image

    from bridge.sandbox import DockerSandbox

    return node_image(DockerSandbox(), BASE_IMAGE)


@pytest.fixture
def real_env(home: Path, model_server) -> dict[str, str]:
    """config.yaml whose model routes all lead to the scripted server; the key variables set."""
    config, env = model_config(model_server.url)
    (home / "config.yaml").write_text(config)
    return env
