"""MCP: time from worker_delegate(wait=false) to the returned task id, and worker_status
latency, through a real stdio client session of the official SDK."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio

from bench.common import median, percentile


async def _session(home: Path, repo: Path, delegations: int, polls: int) -> dict:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=str(Path(sys.executable).parent / "worker-bridge-mcp"),
        env={"WORKER_BRIDGE_HOME": str(home)},
    )
    delegate_ms, status_ms, ids = [], [], []
    async with Client(params) as client:
        await client.list_tools()
        for _ in range(delegations):
            t = time.perf_counter()
            result = await client.call_tool(
                "worker_delegate",
                {
                    "objective": "bench",
                    "repository": str(repo),
                    "metadata": {"mock": {"write": {"b.txt": "b"}}},
                },
            )
            delegate_ms.append((time.perf_counter() - t) * 1000)
            ids.append(result.structured_content["task_id"])
        for i in range(polls):
            t = time.perf_counter()
            await client.call_tool("worker_status", {"task_id": ids[i % len(ids)]})
            status_ms.append((time.perf_counter() - t) * 1000)
        with anyio.fail_after(300):
            for task_id in ids:
                while True:
                    status = await client.call_tool("worker_status", {"task_id": task_id})
                    if status.structured_content["status"] not in (
                        "created",
                        "queued",
                        "running",
                        "verifying",
                    ):
                        break
                    await anyio.sleep(0.2)
    return {
        "delegate_median_ms": median(delegate_ms),
        "delegate_p99_ms": percentile(delegate_ms, 99),
        "status_median_ms": median(status_ms),
        "status_p99_ms": percentile(status_ms, 99),
        "samples": {"delegate_ms": delegate_ms, "status_ms": status_ms},
    }


def bench_mcp(root: Path, repo: Path, delegations: int, polls: int) -> dict:
    return anyio.run(_session, root / "mcp-home", repo, delegations, polls)
