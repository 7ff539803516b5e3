"""A process that hosts nothing but one gateway (as a task's runner does), for measuring its
resident memory from outside while a test plays the sandbox on its Unix sockets. Its routes are
given as JSON: name -> [upstream, paths or null]; its GatewayConfig as JSON keyword arguments."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

_HOST = """
import json, sys
from pathlib import Path
from bridge.config.settings import GatewayConfig
from bridge.gateway.policy import Route
from bridge.gateway.server import Gateway
folder, routes, config = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
made = {
    name: Route(name, upstream, "bearer", None, "host-key", tuple(paths) if paths else None)
    for name, (upstream, paths) in routes.items()
}
events = []
gateway = Gateway(folder, made, config.pop("allowlist", None), GatewayConfig(**config),
                  lambda kind, data: events.append(kind))
gateway.start()
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps({"events": len(events), "free": gateway.budget.free,
                  "capacity": gateway.budget.capacity}), flush=True)
sys.stdin.read()
gateway.stop()
"""


class GatewayHost:
    def __init__(self, folder: Path, routes: dict, **config) -> None:
        self.folder = folder
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOST, str(folder), json.dumps(routes), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self.process = psutil.Process(self.proc.pid)
        self.idle = self.rss()
        self.peak = self.idle
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def rss(self) -> int:
        return self.process.memory_info().rss

    def _sample(self) -> None:
        while not self._done.is_set():
            try:
                self.peak = max(self.peak, self.rss())
            except psutil.Error:
                return
            time.sleep(0.01)

    @property
    def grown_mib(self) -> float:
        return (self.peak - self.idle) / 2**20

    def state(self) -> dict:
        """Events recorded and the budget's free bytes, asked of the hosting process."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        self._done.set()
        self._sampler.join(5)
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
