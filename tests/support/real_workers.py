"""What the real-worker tests share: the scripted model server as the upstream of every model
route (the real key is a test variable the gateway adds on the host), the worker's image built
once, and the checks every worker must pass (key nowhere, no request but the model route)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support.engine import BASE_IMAGE
from support.tasks import task_events

from bridge.smoke.model_server import ModelServer

KEY = "sk-real-" + os.urandom(12).hex()
KEY_VARS = {
    "anthropic": "WB_TEST_ANTHROPIC_KEY",
    "openai": "WB_TEST_OPENAI_KEY",
    "zai": "WB_TEST_ZAI_KEY",
    "claude-subscription": "WB_TEST_CLAUDE_TOKEN",
}
AUTH = {
    "anthropic": "x-api-key",
    "openai": "bearer",
    "zai": "bearer",
    "claude-subscription": "bearer",
}


def model_config(url: str) -> tuple[str, dict[str, str]]:
    """config.yaml whose model routes all lead to the scripted server at URL, and the
    environment that sets their key variables."""
    lines = ["gateway:", "  routes:"]
    for route, var in KEY_VARS.items():
        lines += [
            f"    {route}:",
            f"      upstream: {url}",
            f"      auth: {AUTH[route]}",
            f"      key_env: {var}",
        ]
    return "\n".join(lines) + "\n", {var: KEY for var in KEY_VARS.values()}


def ensure_worker_image(config, name: str) -> str:
    """The worker's image, built when absent (the test session's first real-worker test)."""
    from bridge.sandbox import DockerSandbox
    from bridge.sandbox.images import build_images

    sandbox = DockerSandbox()
    tag = config.image_for(name)
    if not sandbox.image_present(tag):
        # npm inside the build trusts what this machine trusts (`make test` passes its CA file)
        ca = os.environ.get("WORKER_BRIDGE_EXTRA_CA_FILE")
        if ca and config.extra_ca_file is None:
            config = config.model_copy(update={"extra_ca_file": Path(ca)})
        build_images(config, sandbox, [name], BASE_IMAGE, on_line=lambda _: None)
    return tag


def assert_key_nowhere(home: Path, key: str = KEY) -> None:
    """The real key is in no file of the state root: store, artifacts, the CLI's home, inputs."""
    proc = subprocess.run(
        ["grep", "-r", "-l", "-a", "-F", key, str(home)], capture_output=True, text=True
    )
    assert proc.returncode == 1, f"the key was found in: {proc.stdout}"


def assert_only_model_route(cli, task_id: str, env: dict, server: ModelServer) -> None:
    """The CLI made no request but its model route: nothing refused by the gateway, nothing
    unexpected at the server."""
    refused = task_events(cli, task_id, env, "network.refused")
    assert refused == [], json.dumps(refused)[:2000]
    assert server.unexpected() == [], [r.path for r in server.unexpected()]
