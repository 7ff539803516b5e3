"""What a task container is, independent of the engine that runs it (no docker import here, so
commands that never start a container stay quick to load)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

LABEL = "io.worker-bridge"

# Container states in our own words, whatever the engine calls them: `created` (not started
# yet), `running` (includes paused and restarting), `exited` (includes dead), `removing`.
ContainerState = Literal["created", "running", "exited", "removing"]


def home_id(home: Path) -> str:
    """The label value that ties a container to one state root."""
    return hashlib.sha256(str(home).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = True
    # `rslave`: mounts the host makes under the source later reach the container (the pool's
    # slot folders, bridge/sandbox/pool.py); None: the engine's default (private).
    propagation: str | None = None


@dataclass
class ContainerSpec:
    """Everything the engine needs to start one hardened task container."""

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
    log_max_mb: int = 16  # what the engine keeps of the container's output, at most
    # A project's own image: its entrypoint is not ours to run (None keeps the image's), and
    # the setup phase writes its root filesystem (committed afterwards as the cached result).
    entrypoint: list[str] | None = None
    read_only_root: bool = True


@dataclass(frozen=True)
class ImageInfo:
    """What the pipeline reads of an image: its id, labels and the environment it sets."""

    id: str
    labels: dict[str, str]
    env: dict[str, str]
    tags: tuple[str, ...] = ()
    size: int = 0
    created: str = ""


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    state: ContainerState
    labels: dict[str, str]


@dataclass
class ExitInfo:
    """How a container ended. ``duration_s`` is the engine's own record of the run (start to
    exit), not something the container could write; None when it never ran or was removed."""

    exit_code: int | None
    oom_killed: bool
    timed_out: bool = False
    duration_s: float | None = None
    finished_at: float | None = None  # the engine's record of the exit (epoch seconds)
