"""A worker flooding its gateway cannot grow the runner's memory: 64 connections each sending a
30 MB body, from inside a real task's sandbox, through the worker's gateway (a model route) and
through a setup's gateway (the allowlist proxy, where setup_max_connections is 1024). The
runner's resident memory is measured from outside, on its process and its children, while it
runs; every byte still reaches the upstream, which drops it unread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from support.repos import commit_all
from support.tasks import mock_task, write_spec

CONNECTIONS = 64
BODY_MB = 30
BOUND_MB = 256

# Runs inside the sandbox: CONNECTIONS threads each POST a BODY_MB body, streamed, either to a
# model route (argv: route base URL) or through the proxy (argv: proxy URL and absolute URL).
FLOOD = f"""
import json, socket, sys, threading
from urllib.parse import urlsplit
connections, size = {CONNECTIONS}, {BODY_MB} * 2**20
if len(sys.argv) == 2:
    where = urlsplit(sys.argv[1])
    address, target = (where.hostname, where.port), where.path + "/v1/discard"
else:
    where = urlsplit(sys.argv[1])
    address, target = (where.hostname, where.port), sys.argv[2]
statuses = []
def one():
    try:
        send()
    except OSError as exc:  # a connection that failed is counted, not lost with its thread
        statuses.append(repr(exc))
def send():
    s = socket.create_connection(address, timeout=120)
    s.sendall(("POST %s HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n"
               "Content-Length: %d\\r\\n\\r\\n" % (target, size)).encode())
    block = b"f" * 2**20
    for _ in range(size // len(block)):
        s.sendall(block)
    answer = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        answer += chunk
    statuses.append(int(answer.split(b" ", 2)[1]) if answer else 0)
threads = [threading.Thread(target=one) for _ in range(connections)]
for t in threads: t.start()
for t in threads: t.join()
print("flood statuses:", json.dumps(sorted(set(map(str, statuses)))), "over", len(statuses))
"""

pytestmark = pytest.mark.usefixtures("docker_images")


class PeakMemory:
    """The most resident memory a process and its children held together, sampled from
    outside every 20 ms while it runs."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while True:
            try:
                family = [self.process, *self.process.children(recursive=True)]
                total = sum(p.memory_info().rss for p in family if p.is_running())
            except psutil.Error:
                return
            self.peak = max(self.peak, total)
            time.sleep(0.02)

    def join(self) -> int:
        self._thread.join(timeout=10)
        return self.peak


def run_measured(home: Path, spec_path: Path, env: dict[str, str]) -> tuple[dict, int]:
    """`worker-bridge tasks run --spec ... --json` (the runner is that process), its result
    and its peak resident memory."""
    script = Path(sys.executable).parent / "worker-bridge"
    proc = subprocess.Popen(
        [str(script), "tasks", "run", "--spec", str(spec_path), "--json"],
        env={**os.environ, "WORKER_BRIDGE_HOME": str(home), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    meter = PeakMemory(proc.pid)
    out, err = proc.communicate(timeout=600)
    peak = meter.join()
    assert out.strip(), err
    return json.loads(out), peak


def flood_line(home: Path, result: dict) -> str:
    """What the flood script printed of its connections' answers (a worker's or a setup's
    output)."""
    from bridge import WorkerBridge

    bridge = WorkerBridge(home=home)
    try:
        page = bridge.task_logs(result["task_id"], limit=10_000)
    finally:
        bridge.close()
    lines = [str(e.data.get("text")) for e in page.events if "flood statuses" in str(e.data)]
    return lines[-1] if lines else "the flood printed no statuses"


def test_a_flood_through_the_worker_gateway_leaves_the_runner_under_its_bound(
    workdir, home, repo, upstream
):
    (home / "config.yaml").write_text(
        "allow_mock_routes: true\n"
        "gateway:\n  routes:\n    test:\n"
        f"      upstream: {upstream.url}\n      auth: x-api-key\n      key_env: WB_FLOOD_KEY\n"
    )
    script = "python3 - \"$WB_ROUTE_TEST\" <<'PYEOF'\n" + FLOOD + "\nPYEOF"
    spec = mock_task(repo, {"routes": ["test"], "script": script}, verify=["true"])
    spec["limits"] = {"timeout_seconds": 600}
    result, peak = run_measured(home, write_spec(workdir / "s.json", spec), {"WB_FLOOD_KEY": "k"})
    assert result["status"] == "succeeded", result["error"]
    assert upstream.discarded == CONNECTIONS * BODY_MB * 2**20, flood_line(home, result)
    assert result["usage"]["bytes_up"] >= CONNECTIONS * BODY_MB * 2**20
    assert peak < BOUND_MB * 2**20, f"the runner peaked at {peak / 2**20:.0f} MiB"


def test_a_flood_through_a_setup_gateway_leaves_the_runner_under_its_bound(
    workdir, home, repo, upstream, docker_images
):
    (home / "config.yaml").write_text(
        f"gateway:\n  trusted_ranges: ['127.0.0.0/8']\n  http_ports: [{upstream.port}]\n"
    )
    (repo / "flood.py").write_text(FLOOD)
    commit_all(repo, "a setup that floods its gateway")
    setup = f'python3 flood.py "$HTTP_PROXY" http://localhost:{upstream.port}/discard'
    spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["true"])
    spec["environment"] = {
        "image": docker_images.image_for("mock"),
        "setup": [setup],
        "setup_network": ["localhost"],
    }
    spec["limits"] = {"timeout_seconds": 600}
    result, peak = run_measured(home, write_spec(workdir / "s.json", spec), {})
    assert result["status"] == "succeeded", result["error"]
    assert upstream.discarded == CONNECTIONS * BODY_MB * 2**20, flood_line(home, result)
    assert peak < BOUND_MB * 2**20, f"the runner peaked at {peak / 2**20:.0f} MiB"
