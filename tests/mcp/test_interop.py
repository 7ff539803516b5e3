"""Interoperability: `worker-bridge-mcp` driven by a client nobody here wrote, the TypeScript MCP
SDK (`@modelcontextprotocol/sdk`, pinned in tests/interop/package.json).

The client (tests/interop/mcp_client.mjs) needs node and `npm ci --prefix tests/interop`. Without
them the test is skipped with the reason, unless WORKER_BRIDGE_REQUIRE_INTEROP=1, which makes a
missing client a failure (for CI)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.mcp_session import MCP_TOOLS

INTEROP = Path(__file__).parents[1] / "interop"
CLIENT = INTEROP / "mcp_client.mjs"
SDK = INTEROP / "node_modules" / "@modelcontextprotocol" / "sdk"
SERVER = Path(sys.executable).parent / "worker-bridge-mcp"
REQUIRE = os.environ.get("WORKER_BRIDGE_REQUIRE_INTEROP") == "1"


@pytest.fixture
def node() -> str:
    """The node binary, with the TypeScript SDK installed next to the client script."""
    found = shutil.which("node")
    missing = None
    if found is None:
        missing = "node is not on PATH"
    elif not SDK.is_dir():
        missing = f"{SDK} is missing; `make test-deps` installs it"
    if missing:
        if REQUIRE:
            pytest.fail(f"WORKER_BRIDGE_REQUIRE_INTEROP=1 but {missing}")
        pytest.skip(f"TypeScript MCP client not available: {missing}")
    return found


def test_the_typescript_sdk_client_lists_the_tools_and_runs_a_task_to_success(
    node, home, repo, docker_images
):
    assert SERVER.exists(), f"the console script {SERVER} is not installed"
    proc = subprocess.run(
        [
            node,
            str(CLIENT),
            "--command",
            str(SERVER),
            "--home",
            str(home),
            "--repo",
            str(repo),
            "--deadline-s",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "WORKER_BRIDGE_HOME": str(home)},
    )
    assert proc.returncode == 0, f"the TypeScript client failed:\n{proc.stderr[-3000:]}"
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    outcome = json.loads(lines[0])

    assert set(outcome["tools"]) == MCP_TOOLS
    assert outcome["status"] == "succeeded", outcome
    assert outcome["error"] is None
    assert outcome["changed_files"] == [{"path": "interop.txt", "change": "added"}]
    assert outcome["task_id"]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
