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


def test_a_host_runs_a_delegation_as_an_mcp_task_with_the_typescript_sdks_task_client(
    node, home, repo, docker_images
):
    # The 2025-11-25 tasks utility as a host drives it: the SDK sees the tools that support
    # tasks, creates one, polls tasks/get, fetches tasks/result; cancels another; asks for one
    # that does not exist; runs a compete and a follow-up of its candidate as tasks
    # (tests/interop/mcp_tasks.mjs).
    script = INTEROP / "mcp_tasks.mjs"
    argv = [node, str(script), "--command", str(SERVER), "--home", str(home), "--repo", str(repo)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=150, env={**os.environ})
    assert proc.returncode == 0, f"the TypeScript task client failed:\n{proc.stderr[-3000:]}"
    seen = json.loads(proc.stdout.strip().splitlines()[-1])

    assert seen["capabilities"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    assert seen["task_tools"] == [
        "worker_compete",
        "worker_delegate",
        "worker_follow_up",
        "worker_review",
    ]
    kinds = [m["type"] for m in seen["delegated"]]
    assert kinds[0] == "taskCreated" and kinds[-1] == "result", kinds
    task_id = seen["delegated"][0]["task"]["taskId"]
    statuses = [m["status"] for m in seen["delegated"] if m["type"] == "taskStatus"]
    assert statuses[-1] == "completed" and set(statuses) <= {"working", "completed"}, statuses
    said = [m["said"] for m in seen["delegated"] if m["type"] == "taskStatus"]
    assert any(s.startswith("running") for s in said), said  # where it is, in words
    result = seen["delegated"][-1]["result"]
    assert result["structuredContent"]["task_id"] == task_id  # the MCP task is our task
    assert result["structuredContent"]["status"] == "succeeded"
    assert result["structuredContent"]["changed_files"] == [
        {"path": "tasks.txt", "change": "added"}
    ]
    assert not (repo / "tasks.txt").exists(), "nothing reaches the repository before accept"
    assert seen["got"]["status"] == "completed" and seen["got"]["ttl"] is None
    assert [task_id, "completed"] in seen["listed"]

    cancelled = seen["cancelled"]
    assert cancelled["status"] == "cancelled", cancelled
    assert [m["type"] for m in seen["long"]][:1] == ["taskCreated"]
    job = seen["competed"][0]["task"]["taskId"]
    assert job.startswith("job-") and seen["competed"][-1]["type"] == "result"
    assert seen["competed"][-1]["result"]["structuredContent"]["job_id"] == job
    assert seen["candidate"] and seen["candidate"] != job
    followed = seen["followed"]
    assert followed[0]["task"]["taskId"] == seen["candidate"], followed  # the task, not its job
    assert followed[-1]["type"] == "result", followed
    assert followed[-1]["result"]["structuredContent"]["task_id"] == seen["candidate"]
    assert "feedfacecafe" in seen["unknown"] and "Failed to retrieve task" in seen["unknown"]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
