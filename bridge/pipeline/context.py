"""What every pipeline step needs: the effective config, the store, the sandbox, and who we are."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.config import Config
from bridge.sandbox.spec import LABEL, home_id
from bridge.store import Store

if TYPE_CHECKING:
    from bridge.sandbox.docker import DockerSandbox


@dataclass
class Context:
    config: Config
    store: Store
    sandbox: DockerSandbox

    @property
    def home(self) -> Path:
        return self.config.home

    def sandbox_identity(self) -> tuple[str, tuple[int, int] | None]:
        """(user for the container, owner to chown the worktree to or None).

        A non-root bridge runs the sandbox as itself, so files stay the user's; a root bridge
        hands the worktree to the unprivileged sandbox uid for the run.
        """
        if os.geteuid() != 0:
            return f"{os.getuid()}:{os.getgid()}", None
        uid = self.config.sandbox_uid
        return f"{uid}:{uid}", (uid, uid)

    def labels(self, task_id: str, role: str, **extra: str) -> dict[str, str]:
        return {
            f"{LABEL}.task": task_id,
            f"{LABEL}.role": role,
            f"{LABEL}.home": home_id(self.home),
            **{f"{LABEL}.{k}": v for k, v in extra.items()},
        }

    def task_dir(self, task_id: str) -> Path:
        return self.home / "tasks" / task_id
