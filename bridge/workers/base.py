"""What a worker plugin is: its image, how its command line is built for a turn, and how its
output stream turns into progress events, a final summary, a session id and a failure."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

from bridge.asking import ASKING
from bridge.config.settings import Config
from bridge.events import ProgressEvent
from bridge.models import JsonObject

# Inside every task container: the read-only inputs folder (prompt and worker files).
INPUTS_DIR = "/bridge"
# Inside every worker container: the CLI's home, kept across the task's turns.
HOME_DIR = "/home/worker"

ProgressKind = Literal["message", "tool", "command", "file_edit", "error"]


@dataclass(frozen=True)
class Turn:
    """One run of a worker on a task: the first turn, or a follow-up / repair turn."""

    objective: str
    metadata: JsonObject
    number: int = 0
    message: str | None = None  # follow-up or repair instruction
    session_id: str | None = None  # the CLI's own session of the earlier turns, to resume
    permission: str = "workspace_write"

    @property
    def prompt(self) -> str:
        """The whole task for a CLI that keeps no session (objective and follow-up together),
        or a session's first turn; either way with how to ask (bridge/asking.py)."""
        if self.message:
            return f"{self.objective}\n{ASKING}\n\nFollow-up:\n{self.message}\n"
        return f"{self.objective}\n{ASKING}\n"

    @property
    def resumed_prompt(self) -> str:
        """What a turn that resumes the CLI's session sends: the session has the objective."""
        return (self.message or self.objective) + "\n"

    @property
    def read_only(self) -> bool:
        return self.permission == "read_only"


@dataclass
class WorkerLaunch:
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # name -> content under INPUTS_DIR
    # path under the CLI home -> content, mounted read-only there (the CLI's config files:
    # written by the host into a fresh folder of its own, never into the worker's home)
    home_files: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)  # values to mask wherever they show up


@dataclass(frozen=True)
class Progress:
    """One `worker.progress` event, the same shape for every worker."""

    kind: ProgressKind
    text: str
    name: str | None = None  # the tool or command

    def document(self) -> ProgressEvent:
        return {"kind": self.kind, "text": self.text, "name": self.name}


@dataclass
class ParsedLine:
    progress: list[Progress] = field(default_factory=list)
    summary: str | None = None
    session_id: str | None = None
    # the CLI's own account of why it failed (refused key, rate limit, unknown model...):
    # one sentence that says which and what to do; the last one seen is the task's error
    failure: str | None = None

    @classmethod
    def message(cls, text: str, **more: Any) -> ParsedLine:
        return cls(progress=[Progress("message", text)], **more)


class Worker(ABC):
    name: str
    capabilities: tuple[str, ...] = ()
    # a CLI with a native session resumes it on follow-up and repair turns; without one,
    # each turn gets the objective and the follow-up together
    resumes_sessions: bool = False
    # What the CLI's session ids look like. The id comes from the worker's own output and goes
    # onto the next turn's command line, so anything else (a forged `--flag`, a secret, escape
    # codes) is not taken.
    session_pattern: str = r"[A-Za-z0-9_-]{1,128}"
    # A command that shows the worker's CLI runs inside a project's environment image (with
    # the worker image's bundle mounted at /opt/worker-bridge); None: it cannot run in one.
    probe: tuple[str, ...] | None = None

    def session_ok(self, session_id: str) -> bool:
        return re.fullmatch(self.session_pattern, session_id) is not None and not (
            session_id.startswith("-")
        )

    @abstractmethod
    def image(self, config: Config) -> str: ...

    @property
    def build_target(self) -> str | None:
        """What `worker-bridge images build` calls this worker's image (None: not ours)."""
        return self.name

    @abstractmethod
    def launch(self, turn: Turn, config: Config) -> WorkerLaunch: ...

    def parse_line(self, line: str) -> ParsedLine:
        return ParsedLine.message(line)

    def routes(self, metadata: JsonObject, config: Config) -> list[str]:
        """The gateway's model routes this worker uses (each gets the real key on the host)."""
        return []

    def health(self, config: Config) -> str | None:
        """Why this worker cannot run here besides its image (e.g. a missing credential), as
        one sentence; None when nothing is missing."""
        return None

    def can_repair(self, metadata: JsonObject) -> bool:
        """Whether a repair turn (after failed verification) can change anything."""
        return True

    def check_metadata(self, metadata: JsonObject, config: Config) -> None:
        """InvalidSpec for metadata this worker cannot use (checked at creation)."""
        return None
