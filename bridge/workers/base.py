"""What a worker plugin is: its image, how its command line is built from the prompt, and how its
output stream turns into progress events and a final summary."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from bridge.config import Config

# Inside every task container: the read-only inputs folder (prompt and worker files).
INPUTS_DIR = "/bridge"


@dataclass(frozen=True)
class Turn:
    """One run of a worker on a task: the first turn, or a follow-up / repair turn."""

    objective: str
    metadata: dict[str, Any]
    number: int = 0
    message: str | None = None  # follow-up or repair instruction

    @property
    def prompt(self) -> str:
        if self.message:
            return f"{self.objective}\n\nFollow-up:\n{self.message}\n"
        return self.objective + "\n"


@dataclass
class WorkerLaunch:
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # name -> content under INPUTS_DIR
    secrets: list[str] = field(default_factory=list)  # values to mask wherever they show up


@dataclass
class ParsedLine:
    progress: str | None = None
    summary: str | None = None
    session_id: str | None = None


class Worker(ABC):
    name: str
    capabilities: tuple[str, ...] = ()

    @abstractmethod
    def image(self, config: Config) -> str: ...

    @property
    def build_target(self) -> str | None:
        """What `worker-bridge images build` calls this worker's image (None: not ours)."""
        return self.name

    @abstractmethod
    def launch(self, turn: Turn) -> WorkerLaunch: ...

    def parse_line(self, line: str) -> ParsedLine:
        return ParsedLine(progress=line)

    def routes(self, metadata: dict[str, Any]) -> list[str]:
        """The gateway's model routes this worker uses (each gets the real key on the host)."""
        return []

    def health(self, config: Config) -> str | None:
        """Why this worker cannot run here besides its image (e.g. a missing credential), as
        one sentence; None when nothing is missing."""
        return None

    def can_repair(self, metadata: dict[str, Any]) -> bool:
        """Whether a repair turn (after failed verification) can change anything."""
        return True
