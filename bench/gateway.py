"""The gateway's cost: per-request latency (p50/p99) of a small JSON call through a model route,
the throughput of a streamed 10 MB response and of a 30 MB request body, each against the same
upstream (on loopback) reached directly, alternated in one run and reported as ratios. The
client speaks to the gateway's Unix socket the way the sandbox's relay does; the relay itself
(socat in the container) is not in the measurement.

And its memory under a flood: a process that hosts nothing but a gateway (as a task's runner
does), flooded with 64 connections each sending a 30 MB body, its peak resident memory sampled
from outside against the same process's resident memory before the flood."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from aiohttp import web

from bench.common import median, percentile
from bridge.config.settings import GatewayConfig
from bridge.gateway.policy import Route
from bridge.gateway.server import ROUTES_SOCKET, Gateway

STREAM_BYTES = 10 * 2**20
UPLOAD_BYTES = 30 * 2**20
FLOOD_CONNECTIONS = 64


class _Upstream:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_get("/v1/small", lambda r: web.json_response({"ok": True}))
        app.router.add_get("/v1/stream", self._stream)
        app.router.add_post("/v1/upload", self._upload)
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

    async def _upload(self, request: web.Request) -> web.Response:
        seen = 0
        async for chunk in request.content.iter_any():
            seen += len(chunk)
        return web.json_response({"received": seen})

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


def _post(connect, target: str, size: int) -> int:
    """One POST of ``size`` bytes (Connection: close), sent a MiB at a time; returns the status."""
    block = b"u" * 2**20
    with connect() as s:
        head = f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        s.sendall((head + f"Content-Length: {size}\r\n\r\n").encode())
        for _ in range(size // len(block)):
            s.sendall(block)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


# The process the flood measures: a gateway and nothing else, until its stdin closes.
_HOST = """
import sys
from pathlib import Path
from bridge.config.settings import GatewayConfig
from bridge.gateway.policy import Route
from bridge.gateway.server import Gateway
routes = {"b": Route("b", sys.argv[2], "bearer", None, "k")}
gateway = Gateway(Path(sys.argv[1]), routes, None, GatewayConfig(max_events=10), lambda k, d: None)
gateway.start()
print("ready", flush=True)
sys.stdin.read()
gateway.stop()
"""


def _flood_memory(upstream_port: int, connections: int, body: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="wb-gw-flood-", dir="/dev/shm"))
    host = subprocess.Popen(
        [sys.executable, "-c", _HOST, str(folder), f"http://127.0.0.1:{upstream_port}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == "ready"
        process = psutil.Process(host.pid)
        idle = process.memory_info().rss
        peak, done = idle, threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, process.memory_info().rss)
                time.sleep(0.02)

        def via() -> socket.socket:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(folder / ROUTES_SOCKET))
            return s

        statuses: list[int] = []
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        flood = [
            threading.Thread(target=lambda: statuses.append(_post(via, "/b/v1/upload", body)))
            for _ in range(connections)
        ]
        for thread in flood:
            thread.start()
        for thread in flood:
            thread.join()
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
    finally:
        if host.stdin is not None:
            host.stdin.close()
        host.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
    if statuses != [200] * connections:
        raise RuntimeError(f"gateway flood: answers {sorted(set(statuses))}, not all 200")
    return {
        "connections": connections,
        "body_mb": body // 2**20,
        "idle_rss_mib": round(idle / 2**20, 1),
        "peak_rss_mib": round(peak / 2**20, 1),
        "peak_vs_idle_ratio": round(peak / idle, 2),
        "flood_s": round(seconds, 2),
    }


def _latency_ms(connect, target: str) -> float:
    t0 = time.perf_counter()
    _get(connect, target, "127.0.0.1")
    return (time.perf_counter() - t0) * 1000


def _stream_mib_s(connect, target: str) -> float:
    t0 = time.perf_counter()
    size = _get(connect, target, "127.0.0.1")
    return size / 2**20 / (time.perf_counter() - t0)


def _upload_mib_s(connect, target: str) -> float:
    t0 = time.perf_counter()
    _post(connect, target, UPLOAD_BYTES)
    return UPLOAD_BYTES / 2**20 / (time.perf_counter() - t0)


def _alternate(
    rounds: int, paths: tuple, path: str, once: Callable[[Callable, str], float]
) -> tuple[list[float], list[float]]:
    """ROUNDS measurements of PATH straight to the upstream and through the gateway (route
    `b`), taken in turn so that the machine's drift falls on both alike; ONCE is one."""
    direct, via = paths
    direct_out: list[float] = []
    via_out: list[float] = []
    for _ in range(rounds):
        direct_out.append(once(direct, path))
        via_out.append(once(via, "/b" + path))
    return direct_out, via_out


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
        paths = (direct, via)
        lat_direct, lat_via = _alternate(samples, paths, "/v1/small", _latency_ms)
        thr_direct, thr_via = _alternate(max(samples // 10, 3), paths, "/v1/stream", _stream_mib_s)
        up_direct, up_via = _alternate(max(samples // 50, 3), paths, "/v1/upload", _upload_mib_s)
        flood = _flood_memory(upstream.port, FLOOD_CONNECTIONS, UPLOAD_BYTES)
    finally:
        gateway.stop()
        upstream.stop()
        shutil.rmtree(folder, ignore_errors=True)
    result = {
        "direct_p50_ms": round(median(lat_direct), 3),
        "direct_p99_ms": round(percentile(lat_direct, 99), 3),
        "gateway_p50_ms": round(median(lat_via), 3),
        "gateway_p99_ms": round(percentile(lat_via, 99), 3),
        "stream_direct_mib_s": round(median(thr_direct), 1),
        "stream_gateway_mib_s": round(median(thr_via), 1),
        "upload_direct_mib_s": round(median(up_direct), 1),
        "upload_gateway_mib_s": round(median(up_via), 1),
        "flood": flood,
    }
    result["latency_p50_ratio"] = round(result["gateway_p50_ms"] / result["direct_p50_ms"], 2)
    result["latency_p99_ratio"] = round(result["gateway_p99_ms"] / result["direct_p99_ms"], 2)
    result["stream_throughput_ratio"] = round(
        result["stream_gateway_mib_s"] / result["stream_direct_mib_s"], 3
    )
    result["upload_throughput_ratio"] = round(
        result["upload_gateway_mib_s"] / result["upload_direct_mib_s"], 3
    )
    print(
        f"  gateway: p50 {result['gateway_p50_ms']:.2f} ms vs direct {result['direct_p50_ms']:.2f} "
        f"ms ({result['latency_p50_ratio']}x), p99 {result['latency_p99_ratio']}x; 10 MB stream "
        f"{result['stream_gateway_mib_s']} vs {result['stream_direct_mib_s']} MiB/s "
        f"({result['stream_throughput_ratio']}x); 30 MB upload {result['upload_gateway_mib_s']} vs "
        f"{result['upload_direct_mib_s']} MiB/s ({result['upload_throughput_ratio']}x)"
    )
    print(
        f"  gateway flood ({flood['connections']} x {flood['body_mb']} MB bodies): the process "
        f"hosting it peaked at {flood['peak_rss_mib']} MiB resident, {flood['idle_rss_mib']} "
        f"MiB before ({flood['peak_vs_idle_ratio']}x), in {flood['flood_s']} s"
    )
    return result
