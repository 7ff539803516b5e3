"""Calling the facade from the MCP server's event loop: every blocking call (SQLite, git,
Docker) in a worker thread, so no tool blocks the loop; a BridgeError becomes a tool error
(`isError`) with its one sentence, anything else a tool error that points at the server log."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from bridge.errors import BridgeError
from bridge.service import WorkerBridge

log = logging.getLogger("worker_bridge.mcp")
T = TypeVar("T")


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
            raise ToolError(exc.message) from exc
        except ToolError:
            raise
        except Exception as exc:
            log.exception("tool call failed")
            raise ToolError(
                f"worker-bridge hit an internal error ({exc.__class__.__name__}); "
                "see the server log under the state root's logs/ folder."
            ) from exc
