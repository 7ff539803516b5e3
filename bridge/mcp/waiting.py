"""`wait: true` without MCP tasks: a blocking call that no client times out on.

While it waits, a call whose client sent a `progressToken` gets a progress notification when
the task's status or phase changes and at least every PROGRESS_EVERY_S (where it is, how long
it has waited, how many events the task has written). Whatever the client, the call returns by
WAIT_RETURN_S at the latest (hosts give up on a request after about 60 s): the result as it is
then, with `next` saying how to go on. A task that settles first (ended, or waiting for an
answer) returns at once, as before.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from mcp.server.mcpserver import Context

POLL_SECONDS = 0.25
PROGRESS_EVERY_S = 5.0
WAIT_RETURN_S = 50.0

T = TypeVar("T")


async def wait_settled(
    read: Callable[[], Awaitable[T]],
    settled: Callable[[T], bool],
    where: Callable[[T], Awaitable[str]],
    ctx: Context | None,
    *,
    return_after_s: float = WAIT_RETURN_S,
) -> tuple[T, bool]:
    """``read()`` until ``settled`` says so, reporting ``where`` it is as progress; (the last
    read, whether it settled) by ``return_after_s``."""
    began = time.monotonic()
    said, said_at = "", began
    while True:
        current = await read()
        if settled(current):
            return current, True
        now = time.monotonic()
        if ctx is not None:
            place = await where(current)
            if place != said or now - said_at >= PROGRESS_EVERY_S:
                waited = now - began
                await ctx.report_progress(waited, None, f"{place}; waited {waited:.0f} s")
                said, said_at = place, now
        if now - began >= return_after_s:
            return current, False
        await anyio.sleep(POLL_SECONDS)


def next_step(what: str, status: str, status_tool: str) -> str:
    """The sentence a result returned before its work settled carries as `next`."""
    return (
        f"The {what} is still {status} after {WAIT_RETURN_S:.0f} s of waiting; call "
        f"{status_tool} with its id for the result (or wait again)."
    )
