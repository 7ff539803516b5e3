"""Packaging: a wheel built from the repository, installed in a fresh virtualenv, carries the image
contexts, builds the images from them, passes `doctor` and runs a mock task end to end.

The wheel is built from a copy of the repository (an in-tree build leaves `build/` behind, and
setuptools would ship stale files from it). The virtualenv is made without pip and filled by this
interpreter's pip (`pip --python`), which saves the seconds ensurepip takes; its dependencies come
from the configured indexes, as a user's would. The images are built under a tag of the test's own,
FROM the engine's base image tagged alike, so the build is cached and leaves the shared tags alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.scratch import TEST_ROOT
from support.tasks import task_flags

ROOT = Path(__file__).resolve().parents[2]
WRITE_A = {"mock": {"write": {"a.txt": "x"}}}  # the installed wheel's mock task
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "node_modules", ".*_cache"
)


@dataclass
class Installed:
    wheel: Path
    venv: Path
    install_s: float

    @property
    def bin(self) -> Path:
        return self.venv / "bin"


@pytest.fixture(scope="session")
def installed(tmp_path_factory, docker_images):
    """The wheel built from the repository, installed in a fresh virtualenv (only where the
    engine is: what the wheel is for needs it, and the tests that use it are marked `docker`)."""
    root = Path(tempfile.mkdtemp(prefix="wb-wheel-", dir=TEST_ROOT or tmp_path_factory.mktemp("w")))
    try:
        shutil.copytree(ROOT, root / "src", symlinks=True, ignore=NOT_COPIED)
        pip = [sys.executable, "-m", "pip", "-q"]
        subprocess.run(
            [*pip, "wheel", "--no-deps", "-w", root / "dist", root / "src"],
            check=True,
            timeout=300,
        )
        (wheel,) = (root / "dist").glob("worker_bridge-*.whl")
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], check=True)
        subprocess.run(
            [*pip, "--python", root / "venv" / "bin" / "python", "install", wheel],
            check=True,
            timeout=600,
        )
        yield Installed(wheel, root / "venv", time.monotonic() - started)
    finally:
        shutil.rmtree(root)


def _run(installed: Installed, cwd: Path, *args: str, env: dict[str, str]):
    """A command from the installed virtualenv, outside the repository, without its overrides."""
    unset = ("PYTHONPATH", "VIRTUAL_ENV", "WORKER_BRIDGE_IMAGES_DIR")
    full_env = {k: v for k, v in os.environ.items() if k not in unset} | env
    return subprocess.run(
        [str(installed.bin / args[0]), *args[1:]],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _files(folder: Path) -> dict[str, bool]:
    """Every file under ``folder`` (its path there -> whether it is executable)."""
    return {
        p.relative_to(folder).as_posix(): os.access(p, os.X_OK)
        for p in folder.rglob("*")
        if p.is_file() and p.name != "extra-ca.pem"
    }


def test_the_top_level_images_folder_is_the_packages_own():
    assert (ROOT / "images").resolve() == (ROOT / "bridge" / "images").resolve()
    assert {"base", "verify", "mock"} <= {p.name for p in (ROOT / "images").iterdir()}


def test_worker_bridge_images_dir_still_overrides_the_packages_contexts(monkeypatch, tmp_path):
    from bridge.sandbox.images import images_dir

    assert images_dir() == (ROOT / "bridge" / "images").resolve()
    monkeypatch.setenv("WORKER_BRIDGE_IMAGES_DIR", str(tmp_path))
    assert images_dir() == tmp_path


def test_the_wheel_carries_every_image_context_file(installed):
    expected = _files(ROOT / "images")
    prefix = "bridge/images/"
    with zipfile.ZipFile(installed.wheel) as wheel:
        shipped = {
            info.filename.removeprefix(prefix): bool((info.external_attr >> 16) & 0o111)
            for info in wheel.infolist()
            if info.filename.startswith(prefix)
        }
    assert shipped == expected
    assert expected["mock/mock-worker"] and expected["base/wb-relay"]
    (site,) = (installed.venv / "lib").glob("python*/site-packages")
    assert _files(site / "bridge" / "images") == expected


def test_the_wheel_carries_the_web_views_pages_and_vendored_files(installed):
    static = ROOT / "bridge" / "ui" / "static"
    expected = {p.relative_to(static).as_posix() for p in static.rglob("*") if p.is_file()}
    prefix = "bridge/ui/static/"
    with zipfile.ZipFile(installed.wheel) as wheel:
        shipped = {n.removeprefix(prefix) for n in wheel.namelist() if n.startswith(prefix)}
    assert shipped == expected
    assert {"index.html", "task.js", "vendor/diff2html-ui-slim.min.js"} <= shipped
    assert {"vendor/LICENSE.diff2html.md", "vendor/LICENSE.highlight.js"} <= shipped


@pytest.fixture
def image_tag(docker_images):
    """A tag of this test's own, with the engine's base image under it; removed afterwards."""
    import docker

    tag = f"wheeltest-{uuid.uuid4().hex[:8]}"
    client = docker.from_env()
    base = docker_images.image_for("base")
    client.images.get(base).tag(base.rpartition(":")[0], tag)
    yield tag
    for name in ("base", "mock", "verify"):
        try:
            client.images.remove(f"worker-bridge/{name}:{tag}")
        except docker.errors.ImageNotFound:
            pass
    client.close()


def test_an_installed_wheel_builds_the_images_passes_doctor_and_runs_a_mock_task(
    installed, image_tag, workdir, home, repo
):
    cwd = workdir / "elsewhere"
    cwd.mkdir()
    env = {"WORKER_BRIDGE_HOME": str(home), "WORKER_BRIDGE_IMAGE_TAG": image_tag}
    print(f"virtualenv made and the wheel installed in {installed.install_s:.1f} s")

    where = _run(installed, cwd, "python", "-c", _WHERE, env=env)
    assert where.returncode == 0, where.stderr
    package, contexts = where.stdout.split()
    assert Path(package).is_relative_to(installed.venv), package
    assert Path(contexts) == Path(package) / "images"

    built = _run(installed, cwd, "worker-bridge", "images", "build", "mock", "verify", env=env)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr
    assert f"worker-bridge/mock:{image_tag}" in built.stdout

    doctor = _run(installed, cwd, "worker-bridge", "doctor", env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr

    task = _run(
        installed,
        cwd,
        "worker-bridge",
        "tasks",
        "run",
        *task_flags(repo, "write a.txt", verify=("test -f a.txt",), metadata=WRITE_A),
        "--json",
        env=env,
    )
    assert task.returncode == 0, task.stdout + task.stderr
    result = json.loads(task.stdout)
    assert result["status"] == "succeeded", result
    assert result["verification"]["ok"] is True
    assert result["verification"]["image"] == f"worker-bridge/verify:{image_tag}"
    assert result["changed_files"] == [{"path": "a.txt", "change": "added"}]


_WHERE = (
    "import bridge, pathlib; from bridge.sandbox.images import images_dir; "
    "print(pathlib.Path(bridge.__file__).parent, images_dir())"
)
