"""A task's artifacts as MCP resources (bridge/mcp/resources.py), read by a real SDK client: over
HTTP with the token, as a client on another machine would (no file system of the server's), and
over stdio under a `repositories` bound, attacked with another repository's task id and with
paths that leave the repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from support.mcp_http_server import http_client, http_server
from support.mcp_session import (
    call,
    call_error,
    delegate,
    mcp_server,
    task_elsewhere,
    wait_status,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_task_outlives_the_test")]

TEMPLATES = {
    "worker-bridge://tasks/{task_id}/diff",
    "worker-bridge://tasks/{task_id}/manifest",
    "worker-bridge://tasks/{task_id}/logs",
    "worker-bridge://tasks/{task_id}/files/{+path}",
}


async def read(client: Client, uri: str) -> str | bytes:
    """The one content of a resource read that must succeed: its text, or its bytes."""
    found = await client.read_resource(uri)
    (content,) = found.contents
    if hasattr(content, "text"):
        return content.text
    import base64

    return base64.b64decode(content.blob)


async def refused(client: Client, uri: str) -> str:
    """The message of a resource read that must fail."""
    with pytest.raises(MCPError) as failed:
        await client.read_resource(uri)
    message = str(failed.value)
    assert "Traceback" not in message and message.strip(), message
    return message


async def test_a_client_over_http_reads_the_diff_manifest_logs_and_files_of_a_task(
    home, repo, token, token_file, docker_images
):
    mock = {"write": {"hello.txt": "hello\n", "pkg/deep/mod.py": "X = 1\n"}}
    with http_server(home, "--token-file", str(token_file)) as server:
        async with http_client(server.url, token) as client:
            listed = await client.list_resource_templates()
            assert {t.uri_template for t in listed.resource_templates} >= TEMPLATES
            queued = await delegate(client, repo, mock, verify=["test -f hello.txt"])
            task_id = queued["task_id"]
            result = await wait_status(client, task_id, deadline_s=90)
            assert result["status"] == "succeeded", result["error"]
            base = f"worker-bridge://tasks/{task_id}"
            diff = await read(client, f"{base}/diff")
            manifest = json.loads(await read(client, f"{base}/manifest"))
            logs = json.loads(await read(client, f"{base}/logs"))
            deep = await read(client, f"{base}/files/pkg/deep/mod.py")
            untouched = await read(client, f"{base}/files/README.md")
            missing = await refused(client, f"{base}/files/nothing.txt")
            spaced = await refused(client, f"{base}/files/x%20blob")  # git's words in a path
            outside = await refused(client, f"{base}/files/pkg/../../etc/passwd")
            dotted = await refused(client, f"{base}/files/./README.md")
            unknown = await refused(client, "worker-bridge://tasks/no-such-task/diff")
            still = await call(client, "worker_status", {"task_id": task_id})

    assert diff == Path(result["artifacts"]["diff"]).read_text()
    assert "+hello" in diff and "pkg/deep/mod.py" in diff
    assert manifest == json.loads(Path(result["artifacts"]["manifest"]).read_text())
    assert logs["events"][0]["kind"] == "task.created" and logs["has_more"] is False
    assert deep == "X = 1\n"
    assert untouched == (repo / "README.md").read_text()  # the base's files too, as the snapshot
    assert "has no file 'nothing.txt'" in missing
    assert "has no file 'x blob'" in spaced
    assert "Unknown resource" in outside  # the SDK's own check: no `..` in a template's value
    assert "not a path in the repository" in dotted  # ours, for what it lets through
    assert "no-such-task" in unknown
    assert still["status"] == "succeeded"  # the server stayed healthy


async def test_a_bounded_server_reads_nothing_of_another_repositorys_task(home, repo, workdir):
    # A task of another repository in the same state root (made by an unbounded bridge): the
    # bounded server answers as if it did not exist, in the same words as an unknown id.
    foreign = task_elsewhere(home, workdir, {"write": {"secret.txt": "s\n"}})
    (home / "config.yaml").write_text(f"repositories:\n  - {repo}\n")
    async with mcp_server(home) as client:
        answers = [
            await refused(client, f"worker-bridge://tasks/{foreign}/{name}")
            for name in ("diff", "manifest", "logs", "files/README.md")
        ]
        unknown = await refused(client, "worker-bridge://tasks/feedfacecafe/diff")
        tool_said = await call_error(client, "worker_logs", {"task_id": foreign})
    assert all(foreign in a for a in answers), answers
    # The way on is a tool, not a CLI command: the model has tools, not a shell.
    for said in (unknown, tool_said):
        assert "`worker_status` (without a task_id)" in said and "worker-bridge " not in said
    said = {a.replace(foreign, "ID") for a in answers}
    assert said == {unknown.replace("feedfacecafe", "ID")}, (said, unknown)
