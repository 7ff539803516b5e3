"""`wait: true` without MCP tasks (bridge/mcp/waiting.py): progress notifications to a client that
asked for them, over a real SDK session on stdio; and the wait's own rules engine-free: a
return by its bound with `next`, progress at least every PROGRESS_EVERY_S and on each change."""

from __future__ import annotations

import itertools

import anyio
import pytest
from support.mcp_session import mcp_server

from bridge.mcp import waiting

pytestmark = [pytest.mark.anyio]


@pytest.mark.usefixtures("no_task_outlives_the_test")
async def test_a_blocking_delegate_reports_progress_to_a_client_that_asked(
    home, repo, docker_images
):
    seen: list[tuple[float, str | None]] = []

    async def progressed(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    args = {
        "objective": "sleep then write",
        "repository": str(repo),
        "metadata": {"mock": {"sleep": 6, "write": {"late.txt": "x\n"}}},
        "verify": ["sleep 2", "test -f late.txt"],  # long enough to be seen verifying
        "wait": True,
    }
    async with mcp_server(home) as client:
        with anyio.fail_after(120):
            result = await client.call_tool("worker_delegate", args, progress_callback=progressed)
    assert not result.is_error, result.content
    document = result.structured_content
    assert document["status"] == "succeeded" and "next" not in document
    task_id = document["task_id"]
    messages = [m for _, m in seen]
    assert all(m and m.startswith(f"task {task_id} ") for m in messages), messages
    assert any("running" in m for m in messages) and any("verifying" in m for m in messages)
    waited = [p for p, _ in seen]
    assert waited == sorted(waited)  # progress only grows
    gaps = [b - a for a, b in itertools.pairwise([0.0, *waited])]
    assert max(gaps) <= waiting.PROGRESS_EVERY_S + 2, gaps  # never silent for long


class _Progress:
    def __init__(self) -> None:
        self.reports: list[tuple[float, str | None]] = []

    async def report_progress(self, progress, total=None, message=None) -> None:  # noqa: ANN001
        self.reports.append((progress, message))


async def test_a_wait_returns_by_its_bound_with_progress_on_the_way(monkeypatch):
    monkeypatch.setattr(waiting, "PROGRESS_EVERY_S", 0.5)
    monkeypatch.setattr(waiting, "POLL_SECONDS", 0.05)
    reads = itertools.count()
    ctx = _Progress()

    async def read() -> int:
        return next(reads)

    async def where(n: int) -> str:
        return "phase one" if n < 10 else "phase two"

    began = anyio.current_time()
    last, settled = await waiting.wait_settled(
        read, lambda n: False, where, ctx, return_after_s=2.0
    )
    took = anyio.current_time() - began
    assert settled is False and last > 10 and 2.0 <= took < 3.0
    places = [m.split(";")[0] for _, m in ctx.reports]
    assert places[0] == "phase one" and "phase two" in places  # a change is said at once
    waited = [p for p, _ in ctx.reports]
    assert max(b - a for a, b in itertools.pairwise(waited)) <= 0.5 + 0.2
    said = waiting.next_step("task", "running", "worker_status")
    assert said.startswith("The task is still running after 50 s") and "worker_status" in said


async def test_a_wait_that_settles_returns_at_once_without_progress():
    ctx = _Progress()

    async def read() -> str:
        return "succeeded"

    async def where(status: str) -> str:
        raise AssertionError("nothing to report")

    found = await waiting.wait_settled(read, lambda s: s == "succeeded", where, ctx)
    assert found == ("succeeded", True) and ctx.reports == []
