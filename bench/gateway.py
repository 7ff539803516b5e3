"""The gateway's cost: per-request latency (p50/p99) of a small JSON call through a model route,
and the throughput of a streamed 10 MB response, each against the same upstream (on loopback)
reached directly, alternated in one run and reported as ratios. The client speaks to the
gateway's Unix socket the way the sandbox's relay does; the relay itself (socat in the
container) is not in the measurement."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
import time
from pathlib import Path

from aiohttp import web

from bench.common import median, percentile
from bridge.config import GatewayConfig
from bridge.gateway.policy import Route
from bridge.gateway.server import ROUTES_SOCKET, Gateway

STREAM_BYTES = 10 * 2**20


class _Upstream:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_get("/v1/small", lambda r: web.json_response({"ok": True}))
        app.router.add_get("/v1/stream", self._stream)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # noqa: SLF001

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        chunk = b"data: " + b"x" * 65530 + b"\n\n"
        sent = 0
        while sent < STREAM_BYTES:
            await response.write(chunk)
            sent += len(chunk)
        return response

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _get(connect, target: str, host: str) -> int:
    """One GET (Connection: close), reading the whole answer; returns the bytes read."""
    with connect() as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        total = 0
        while chunk := s.recv(1 << 20):
            total += len(chunk)
        return total


def bench_gateway(samples: int) -> dict:
    upstream = _Upstream()
    folder = Path(tempfile.mkdtemp(prefix="wb-gw-", dir="/dev/shm"))
    routes = {"b": Route("b", f"http://127.0.0.1:{upstream.port}", "bearer", None, "k")}
    gateway = Gateway(folder, routes, None, GatewayConfig(max_events=10), lambda k, d: None)
    gateway.start()

    def direct() -> socket.socket:
        return socket.create_connection(("127.0.0.1", upstream.port))

    def via() -> socket.socket:
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(folder / ROUTES_SOCKET))
        return s

    try:
        lat_direct, lat_via = [], []
        for _ in range(samples):
            for fn, out, target in (
                (direct, lat_direct, "/v1/small"),
                (via, lat_via, "/b/v1/small"),
            ):
                t0 = time.perf_counter()
                _get(fn, target, "127.0.0.1")
                out.append((time.perf_counter() - t0) * 1000)
        thr_direct, thr_via = [], []
        for _ in range(max(samples // 10, 3)):
            for fn, out, target in (
                (direct, thr_direct, "/v1/stream"),
                (via, thr_via, "/b/v1/stream"),
            ):
                t0 = time.perf_counter()
                size = _get(fn, target, "127.0.0.1")
                out.append(size / 2**20 / (time.perf_counter() - t0))
    finally:
        gateway.stop()
        upstream.stop()
    result = {
        "direct_p50_ms": round(median(lat_direct), 3),
        "direct_p99_ms": round(percentile(lat_direct, 99), 3),
        "gateway_p50_ms": round(median(lat_via), 3),
        "gateway_p99_ms": round(percentile(lat_via, 99), 3),
        "stream_direct_mib_s": round(median(thr_direct), 1),
        "stream_gateway_mib_s": round(median(thr_via), 1),
    }
    result["latency_p50_ratio"] = round(result["gateway_p50_ms"] / result["direct_p50_ms"], 2)
    result["latency_p99_ratio"] = round(result["gateway_p99_ms"] / result["direct_p99_ms"], 2)
    result["stream_throughput_ratio"] = round(
        result["stream_gateway_mib_s"] / result["stream_direct_mib_s"], 3
    )
    print(
        f"  gateway: p50 {result['gateway_p50_ms']:.2f} ms vs direct {result['direct_p50_ms']:.2f} "
        f"ms ({result['latency_p50_ratio']}x), p99 {result['latency_p99_ratio']}x; 10 MB stream "
        f"{result['stream_gateway_mib_s']} vs {result['stream_direct_mib_s']} MiB/s "
        f"({result['stream_throughput_ratio']}x)"
    )
    return result
