"""Calling the facade from the MCP server's event loop: every blocking call (SQLite, git,
Docker) in a worker thread, so no tool blocks the loop; a BridgeError becomes a tool error
(`isError`) with its one sentence, anything else a tool error that points at the server log.
A sentence that names a CLI command the tools can do names the tool instead (`for_tools`): the
model reading it has tools, not a shell."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from bridge.errors import BridgeError
from bridge.records import AcceptResult
from bridge.service import WorkerBridge

log = logging.getLogger("worker_bridge.mcp")
T = TypeVar("T")

# The CLI's commands a sentence may name, and the tool (with its argument) that does the same.
_AS_TOOLS = [
    (re.compile(r"`worker-bridge tasks list`"), "`worker_status` (without a task_id)"),
    (re.compile(r"`worker-bridge jobs list`"), "`worker_status` (each task's job_id)"),
    (re.compile(r"`worker-bridge tasks show (\w+)`"), r"`worker_status` with task_id \1"),
    (re.compile(r"`worker-bridge tasks logs (\w+)`"), r"`worker_logs` with task_id \1"),
    (re.compile(r"`worker-bridge tasks answer[^`]*`"), "`worker_answer`"),
    (re.compile(r"`worker-bridge workspaces prune --apply`"), "`worker_prune` with apply=true"),
    (re.compile(r"--allow-unverified\b"), "allow_unverified=true"),
    (re.compile(r"--attempts (\d+)"), r"attempts=\1"),
    (re.compile(r"--task(?![\w-])"), "task_id"),
]


def for_tools(sentence: str) -> str:
    """``sentence`` with each CLI command the tools can do named as that tool."""
    for pattern, tool in _AS_TOOLS:
        sentence = pattern.sub(tool, sentence)
    return sentence


class BridgeCalls:
    """One WorkerBridge (one state root), called from async tools."""

    def __init__(self, bridge: WorkerBridge) -> None:
        self.bridge = bridge

    async def plain(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` in a thread, its exceptions as they are."""
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` in a thread; BridgeError becomes a tool error."""
        try:
            return await self.plain(fn, *args, **kwargs)
        except BridgeError as exc:
            raise ToolError(for_tools(exc.message)) from exc
        except ToolError:
            raise
        except Exception as exc:
            log.exception("tool call failed")
            raise ToolError(
                f"worker-bridge hit an internal error ({exc.__class__.__name__}); "
                "see the server log under the state root's logs/ folder."
            ) from exc


def refused_accept(accepted: AcceptResult) -> AcceptResult:
    """``accepted`` when it wrote the change; a tool error with its reason and kind when it was
    refused (nothing was written): a refusal is not a success."""
    if not accepted.accepted:
        reason = accepted.reason or f"Task {accepted.task_id} was not accepted."
        raise ToolError(f"{for_tools(reason)} (refused: {accepted.kind or 'accept'})")
    return accepted
