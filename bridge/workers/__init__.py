"""Worker plugins: the built-in `mock` worker and CLIs linked in config.yaml."""

from __future__ import annotations

from bridge.config.settings import Config
from bridge.errors import UnknownWorker
from bridge.workers.base import (
    HOME_DIR,
    INPUTS_DIR,
    ParsedLine,
    Progress,
    Turn,
    Worker,
    WorkerLaunch,
)
from bridge.workers.claude_code import ClaudeCodeWorker, ZcodeGlmWorker
from bridge.workers.codex import CodexWorker
from bridge.workers.linked import LinkedCliWorker
from bridge.workers.mock import MockWorker, check_mock_metadata
from bridge.workers.opencode import OpencodeWorker

BUILTIN: dict[str, type[Worker]] = {
    "mock": MockWorker,
    "codex": CodexWorker,
    "opencode": OpencodeWorker,
    "claude-code": ClaudeCodeWorker,
    "zcode-glm": ZcodeGlmWorker,
}


def all_workers(config: Config) -> dict[str, Worker]:
    workers: dict[str, Worker] = {name: cls() for name, cls in BUILTIN.items()}
    for name, spec in config.workers.items():
        workers.setdefault(name, LinkedCliWorker(name, spec))
    return workers


def get_worker(config: Config, name: str) -> Worker:
    workers = all_workers(config)
    if name not in workers:
        raise UnknownWorker(
            f"Unknown worker '{name}'; known workers: {', '.join(sorted(workers))} "
            "(link another with `worker-bridge workers link`)."
        )
    return workers[name]


__all__ = [
    "BUILTIN",
    "HOME_DIR",
    "INPUTS_DIR",
    "LinkedCliWorker",
    "MockWorker",
    "ParsedLine",
    "Progress",
    "Turn",
    "Worker",
    "WorkerLaunch",
    "all_workers",
    "check_mock_metadata",
    "get_worker",
]
