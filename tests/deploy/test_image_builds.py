"""Image builds as a newcomer meets them: `make demo` builds only base, verify and mock (nothing
from the npm registry), a network step that fails once passes on its retry, and a build that
still fails names the step, the registry's own error and what to do (for a TLS error: the CA
file setting). The failing builds run through the real engine on small images of their own
(`WORKER_BRIDGE_IMAGES_DIR`), built on the test session's base image."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bridge.config.settings import load_config
from bridge.errors import BridgeError
from bridge.sandbox.images import DEFAULT_TARGETS, build_images, explain_build_failure

ROOT = Path(__file__).resolve().parents[2]


def make_plan(target: str, newer: str) -> str:
    """What `make TARGET` would run, with NEWER taken as just changed (`make -n -W`)."""
    argv = ["make", "-n", "-W", newer, target]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_make_demo_builds_only_the_images_the_demo_uses():
    plan = make_plan("demo", "pyproject.toml")
    [build] = [line for line in plan.splitlines() if "images build" in line]
    assert "--all" not in build
    for worker in ("codex", "claude-code", "opencode"):
        assert worker not in build
    assert DEFAULT_TARGETS == ("base", "verify", "mock")
    assert "npm" not in plan


def test_make_test_installs_what_the_tests_need():
    plan = make_plan("test", "tests/interop/package-lock.json")
    assert "npm ci --prefix tests/interop" in plan
    assert "install-test-deps docker-compose" in plan
    assert "images build --all" in plan


@pytest.mark.parametrize(
    ("said", "hint"),
    [
        ("npm error code SELF_SIGNED_CERT_IN_CHAIN", "extra_ca_file"),
        ("pip._vendor.urllib3.exceptions.SSLError: CERTIFICATE_VERIFY_FAILED", "extra_ca_file"),
        ("npm error code ENOTFOUND", "could not be reached"),
        ("E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease", "reached"),
    ],
)
def test_a_registry_error_is_named_with_what_to_do(said, hint):
    config = load_config(env={"WORKER_BRIDGE_HOME": "/nonexistent-wb-home"})
    message = explain_build_failure(
        "Building x failed at 'Step 5/9 : RUN npm install': returned a non-zero code: 1.",
        ["Step 5/9 : RUN npm install", "npm error network request failed", said, "npm error"],
        config,
    )
    assert "Step 5/9" in message and said in message and hint in message
    plain = explain_build_failure("Building x failed: no space left.", ["Step 1/2 : RUN x"], config)
    assert plain == "Building x failed: no space left.", "no registry error: nothing added"


def _images(tmp: Path, name: str, run: str) -> Path:
    folder = tmp / "images" / name
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text(f"ARG BASE_IMAGE\nFROM ${{BASE_IMAGE}}\nRUN {run}\n")
    return folder.parent


def _build(docker_images, images: Path, name: str, monkeypatch) -> tuple[list[str], list[str]]:
    from bridge.sandbox import DockerSandbox

    monkeypatch.setenv("WORKER_BRIDGE_IMAGES_DIR", str(images))  # only this image's folder
    config = docker_images
    lines: list[str] = []
    sandbox = DockerSandbox()
    try:
        tags = build_images(config, sandbox, [name], on_line=lines.append)
    finally:
        sandbox.remove_image(config.image_for(name))
    return tags, lines


def test_a_network_step_that_fails_once_passes_on_its_retry(docker_images, workdir, monkeypatch):
    # Fails the first time it runs, passes the second: a registry's passing error.
    flaky = (
        "WB_RETRY_ATTEMPTS=2 wb-retry sh -c 'test -e /tmp/tried || { touch /tmp/tried; exit 7; }'"
    )
    images = _images(workdir, "wb-test-flaky", flaky)
    tags, lines = _build(docker_images, images, "wb-test-flaky", monkeypatch)
    assert tags and any("attempt 1 of 2" in line for line in lines), lines[-10:]


def test_a_build_that_still_fails_names_the_step_the_registry_error_and_the_ca_setting(
    docker_images, workdir, monkeypatch
):
    failing = (
        "WB_RETRY_ATTEMPTS=1 wb-retry sh -c "
        "'echo npm error code SELF_SIGNED_CERT_IN_CHAIN >&2; exit 1'"
    )
    images = _images(workdir, "wb-test-tls", failing)
    with pytest.raises(BridgeError) as failed:
        _build(docker_images, images, "wb-test-tls", monkeypatch)
    message = failed.value.message
    assert "Step" in message and "SELF_SIGNED_CERT_IN_CHAIN" in message, message
    assert "extra_ca_file" in message and "WORKER_BRIDGE_EXTRA_CA_FILE" in message, message
    assert "\n" not in message


def test_the_images_the_demo_uses_fetch_nothing_from_the_npm_registry_or_pypi():
    from bridge.sandbox.images import images_dir

    for name in DEFAULT_TARGETS:
        dockerfile = (images_dir() / name / "Dockerfile").read_text()
        for fetch in ("npm ", "pip install", "curl ", "wget "):
            assert fetch not in dockerfile, (name, fetch)
