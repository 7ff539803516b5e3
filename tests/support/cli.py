"""The installed commands as subprocesses: `worker-bridge` (the CLI) and `worker-bridge-mcp` (the
MCP server), from the interpreter's own bin folder, or as modules when they are not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_BIN = Path(sys.executable).parent


def _command(script: str, module: str) -> list[str]:
    path = _BIN / script
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


CLI = _command("worker-bridge", "bridge.cli")
MCP_SERVER = _command("worker-bridge-mcp", "bridge.mcp.server")


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


Cli = Callable[..., CliResult]


def cli_runner(home: Path) -> Cli:
    """`worker-bridge ARGS...` against the state root HOME: run(*args, env=, timeout=)."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> CliResult:
        full_env = {**os.environ, "WORKER_BRIDGE_HOME": str(home), **(env or {})}
        proc = subprocess.run(
            [*CLI, *args], capture_output=True, text=True, env=full_env, timeout=timeout
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run
