"""Specs and config for the project-environment tests: the gateway's route to the tests' own
package index (so setup installs from it on loopback), the Node project's environment and
mock-task spec, and what the index was asked for."""

from __future__ import annotations

import os
from pathlib import Path

from support.registries import PackageServer
from support.tasks import mock_task

# No retries: a setup that cannot reach the registry (an offline snapshot setup) fails at once
# instead of after npm's back-off (about 70 s).
NPM_CI = "npm ci --no-audit --no-fund --fetch-retries=0"
ROUTE_KEY_VAR = "WB_TEST_ROUTE_KEY"
ROUTE_KEY = "sk-env-" + os.urandom(12).hex()


def registry_config(server: PackageServer) -> str:
    """config.yaml letting the gateway reach the package server on loopback, with a keyed
    `test` route to it and the test images allowed."""
    return (
        "allow_mock_routes: true\n"
        "allowed_images: ['worker-bridge-test/*']\n"
        "gateway:\n"
        "  routes:\n"
        "    test:\n"
        f"      upstream: {server.url}\n"
        f"      key_env: {ROUTE_KEY_VAR}\n"
        "  trusted_ranges: ['127.0.0.0/8']\n"
        f"  http_ports: [{server.port}]\n"
    )


def kinds(log: list[dict], prefix: str = "environment.") -> list[str]:
    return [e["kind"] for e in log if e["kind"].startswith(prefix)]


def node_env(image: str, **extra) -> dict:
    """A Node project's environment: IMAGE, `npm ci` from the test index as its setup."""
    return {"image": image, "setup": [NPM_CI], "setup_network": ["localhost"], **extra}


def node_spec(repo: Path, image: str | None, mock: dict | None = None, **extra) -> dict:
    """A mock task on the Node project, verified by `npm test`, in node_env(IMAGE) (or the
    default environment when IMAGE is None)."""
    spec = mock_task(repo, mock or {"write": {"note.txt": "hi\n"}}, verify=["npm test"], **extra)
    if image is not None:
        spec["environment"] = node_env(image)
    return spec


def tarball_requests(server: PackageServer) -> list[str]:
    return [r for r in server.requests if r.endswith(".tgz")]
