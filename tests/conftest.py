"""Shared fixtures: a throwaway state root and repository per test (on /dev/shm when present,
because the root disk here is slow at create-after-delete), the image set built once per
session, the CLI as a subprocess, and cleanup of every container a test's state root started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

TEST_ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
BASE_IMAGE = os.environ.get("WORKER_BRIDGE_TEST_BASE_IMAGE", "worker-bridge/rootfs:bookworm")
REQUIRE_DOCKER = os.environ.get("WORKER_BRIDGE_REQUIRE_DOCKER") == "1"


TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "accepted", "rejected"}
MCP_TOOLS = {
    "worker_delegate",
    "worker_status",
    "list_workers",
    "worker_cancel",
    "worker_logs",
    "worker_prune",
    "worker_accept",
    "worker_follow_up",
}


def git(repo: Path, *args: str, check: bool = True) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {args} failed: {proc.stderr.decode()}")
    return proc.stdout.decode()


@pytest.fixture
def workdir(request):
    """A private folder for one test (state root, repository, scratch)."""
    base = Path(TEST_ROOT) if TEST_ROOT else Path(request.config._tmp_path_factory.getbasetemp())
    path = base / f"wb-test-{uuid.uuid4().hex[:10]}"
    path.mkdir(parents=True)
    yield path
    _remove_containers(path / "home")
    from bridge.workspace.fs import remove_tree  # any depth, never following a link
    from bridge.workspace.trash import reap

    reap(path / "home")  # after the state root's background remover, never beside it
    remove_tree(path)


def _remove_containers(home: Path) -> None:
    """The containers a test's state root started, and the environment images it made (setup
    results and devcontainer builds are tagged per state root: nothing else would remove them)."""
    try:
        from bridge.sandbox import DockerSandbox, home_id

        sandbox = DockerSandbox()
        sandbox.remove_by_labels({"io.worker-bridge.home": home_id(home)})
        made = {"io.worker-bridge.home": home_id(home), "io.worker-bridge.role": "environment"}
        for image in sandbox.images(made):
            sandbox.remove_image(image.id)
    except Exception:
        pass


@pytest.fixture
def home(workdir: Path) -> Path:
    path = workdir / "home"
    path.mkdir()
    return path


@pytest.fixture
def repo(workdir: Path) -> Path:
    """A small committed repository: a module, its test, a .gitignore."""
    path = workdir / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (path / "tests").mkdir()
    (path / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    (path / ".gitignore").write_text("*.log\n__pycache__/\n")
    (path / "README.md").write_text("# demo\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "initial")
    return path


def make_repo(workdir: Path, name: str) -> Path:
    """Another small committed repository next to the `repo` fixture."""
    path = workdir / name
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text(f"# {name}\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "initial")
    return path


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def cli(home: Path):
    """Run `worker-bridge ...` as a subprocess against the test's state root."""
    script = Path(sys.executable).parent / "worker-bridge"
    prefix = [str(script)] if script.exists() else [sys.executable, "-m", "bridge.cli"]

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> CliResult:
        full_env = {**os.environ, "WORKER_BRIDGE_HOME": str(home), **(env or {})}
        proc = subprocess.run(
            [*prefix, *args], capture_output=True, text=True, env=full_env, timeout=timeout
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def bridge(home: Path):
    from bridge import WorkerBridge

    instance = WorkerBridge(home=home)
    yield instance
    instance.close()


@pytest.fixture(scope="session")
def docker_images():
    """The engine is reachable and the image set (base, mock, verify) is built."""
    from bridge.config import load_config
    from bridge.errors import BridgeError
    from bridge.sandbox import DockerSandbox
    from bridge.sandbox.images import build_images

    sandbox = DockerSandbox()
    try:
        sandbox.ping()
    except BridgeError as exc:
        if REQUIRE_DOCKER:
            pytest.fail(f"WORKER_BRIDGE_REQUIRE_DOCKER=1 but: {exc}")
        pytest.skip(str(exc))
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


def pytest_collection_modifyitems(config, items):
    # Tests that use the engine are marked `docker` by fixture use, so `-m "not docker"` works.
    for item in items:
        if "docker_images" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.docker)


def poll(check, what: str, deadline_s: float = 60.0):
    """Return check()'s first truthy value, polling (with backoff) until a deadline."""
    deadline = time.monotonic() + deadline_s
    delay = 0.05
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {deadline_s} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.3)


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(json.dumps(spec))
    return path


def mock_task(repo: Path, mock: dict, *, verify: list[str] | None = None, **extra) -> dict:
    """A spec for the mock worker."""
    spec = {
        "objective": extra.pop("objective", "test task"),
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": verify or []},
        "metadata": {"mock": mock},
    }
    for key, value in extra.items():
        spec[key] = value
    return spec


LABEL = "io.worker-bridge"


class EngineSampler:
    """Samples, in a background thread, the running containers of one state root:
    each sample is a list of (task id, role)."""

    def __init__(self, home: Path) -> None:
        import docker

        from bridge.sandbox import home_id

        self.client = docker.from_env()
        self.filters = {"label": [f"{LABEL}.home={home_id(home)}"]}
        self.samples: list[list[tuple[str, str]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-sampler", daemon=True)

    def __enter__(self) -> EngineSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                found = self.client.containers.list(sparse=True, filters=self.filters)
            except Exception as exc:  # an engine hiccup must not kill the sampler silently
                self.errors.append(repr(exc))
            else:
                sample = []
                for c in found:
                    labels = c.attrs.get("Labels") or {}
                    if c.attrs.get("State", "running") == "running":
                        sample.append((labels.get(f"{LABEL}.task"), labels.get(f"{LABEL}.role")))
                self.samples.append(sample)
            self._stop.wait(0.05)

    def max_count(self, keep=lambda task, role: role == "worker") -> int:
        return max((sum(1 for t, r in s if keep(t, r)) for s in self.samples), default=0)

    def max_per(self, group, role: str = "worker") -> dict[str, int]:
        """Largest number of ``role`` containers seen at once per group(task id)."""
        best: dict[str, int] = defaultdict(int)
        for s in self.samples:
            counts = Counter(group(t) for t, r in s if r == role)
            for key, n in counts.items():
                best[key] = max(best[key], n)
        return dict(best)
