"""A task's artifacts as MCP resources, so a client that does not share the server's file system
(one over HTTP from another machine, any client of the compose service) reads what a local one
reads from `artifacts`:

- `worker-bridge://tasks/{task_id}/diff`: the change, base to snapshot, as git wrote it;
- `worker-bridge://tasks/{task_id}/manifest`: the task's manifest (JSON);
- `worker-bridge://tasks/{task_id}/logs`: the task's first events (JSON, as worker_logs pages
  them; the tool pages further);
- `worker-bridge://tasks/{task_id}/files/{path}`: a file of the task's snapshot (its branch).

Every read goes through the same facade as the tools: a task outside the server's
`repositories` is not found, in the same words as an unknown one, and an HTTP client needs the
token before any of it. A read over MAX_RESOURCE_BYTES is refused with a sentence naming what to
read instead; nothing is ever cut short silently.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError

from bridge.errors import BridgeError
from bridge.mcp.calls import BridgeCalls, for_tools
from bridge.mcp.results import LogPage
from bridge.records import TaskResult

PREFIX = "worker-bridge://tasks/{task_id}"
MAX_RESOURCE_BYTES = 8 * 2**20
LOG_EVENTS = 1000
_BAD_PART = re.compile(r"(^|/)\.{1,2}(/|$)")
_CONTROL = re.compile(r"[\x00\n\r]")


class TaskResources:
    """The resource templates of one server, read through ``call``'s facade."""

    def __init__(self, call: BridgeCalls) -> None:
        self.call = call
        self.bridge = call.bridge

    def register(self, server: MCPServer) -> None:
        templates = [
            ("diff", self.diff, "text/x-diff", "The task's change as git diff wrote it."),
            ("manifest", self.manifest, "application/json", "The task's manifest."),
            ("logs", self.logs, "application/json", "The task's first events."),
        ]
        for name, read, mime, description in templates:
            server.resource(
                f"{PREFIX}/{name}", name=f"task-{name}", mime_type=mime, description=description
            )(read)
        server.resource(
            f"{PREFIX}/files/{{+path}}",
            name="task-file",
            description="A file of the task's snapshot, by its path in the repository (text "
            "when it is UTF-8, else its bytes).",
        )(self.file)

    async def diff(self, task_id: str) -> str | bytes:
        return _text_or_bytes(await self._artifact(task_id, "diff"))

    async def manifest(self, task_id: str) -> str:
        return (await self._artifact(task_id, "manifest")).decode("utf-8", "replace")

    async def logs(self, task_id: str) -> str:
        page = await self._guarded(self.bridge.task_logs, task_id, 0, LOG_EVENTS + 1)
        text = LogPage.of(page.events, 0, LOG_EVENTS).model_dump_json()
        if len(text) > MAX_RESOURCE_BYTES:
            raise ResourceError(
                f"Task {task_id}'s first {LOG_EVENTS} events are over {MAX_RESOURCE_BYTES} "
                "bytes, more than a resource returns; page them with worker_logs."
            )
        return text

    async def file(self, task_id: str, path: str) -> str | bytes:
        if not path or path.startswith("/") or _BAD_PART.search(path) or _CONTROL.search(path):
            raise ResourceError(
                f"'{path[:200]}' is not a path in the repository; give it relative to its top "
                "folder, as changed_files names it."
            )
        found = await self._guarded(self.bridge.snapshot_file, task_id, path, MAX_RESOURCE_BYTES)
        return _text_or_bytes(found)

    # -- the pieces -------------------------------------------------------------------------

    async def _artifact(self, task_id: str, name: str) -> bytes:
        """The task's artifact ``name`` (its diff, its manifest), within MAX_RESOURCE_BYTES."""
        result: TaskResult = await self._guarded(self.bridge.get_task, task_id)
        path = result.artifacts.get(name)
        if not path:
            raise ResourceError(
                f"Task {task_id} has no {name} yet; worker_status shows its status."
            )
        return await self._read(Path(path), f"task {task_id}'s {name}", task_id)

    async def _read(self, path: Path, what: str, task_id: str) -> bytes:
        def read() -> bytes:
            try:
                with path.open("rb") as handle:
                    data = handle.read(MAX_RESOURCE_BYTES + 1)
            except OSError as exc:
                raise ResourceError(
                    f"The server could not read {what} ({exc.strerror}); it may have been pruned."
                ) from exc
            if len(data) > MAX_RESOURCE_BYTES:
                raise ResourceError(
                    f"{what[0].upper()}{what[1:]} is over {MAX_RESOURCE_BYTES} bytes, more than "
                    f"a resource returns; read its files one by one "
                    f"(worker-bridge://tasks/{task_id}/files/{{path}} for each of changed_files)."
                )
            return data

        return await self._guarded(read)

    async def _guarded(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in a thread; a BridgeError a resource error with its sentence."""
        try:
            return await self.call.plain(fn, *args)
        except BridgeError as exc:
            raise ResourceError(for_tools(exc.message)) from exc


def _text_or_bytes(data: bytes) -> str | bytes:
    """Text when it is UTF-8 without a NUL (as source and most diffs are): a client reads it as
    it is; its bytes (base64 on the wire) otherwise."""
    if b"\0" not in data:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return data
