"""What a task container is, independent of the engine that runs it (no docker import here, so
commands that never start a container stay quick to load)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

LABEL = "io.worker-bridge"


def home_id(home: Path) -> str:
    """The label value that ties a container to one state root."""
    return hashlib.sha256(str(home).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = True


@dataclass
class ContainerSpec:
    image: str
    command: list[str]
    user: str
    labels: dict[str, str]
    mounts: list[Mount] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/workspace"
    memory_mb: int = 2048
    cpus: float = 1.0
    pids: int = 512
    runtime: str | None = None
    tmpfs: tuple[str, ...] = ("/tmp", "/home/worker")


@dataclass
class ExitInfo:
    exit_code: int | None
    oom_killed: bool
    timed_out: bool = False
