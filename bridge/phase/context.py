"""What every pipeline step needs: the configuration it runs with, the store, the sandbox, and who
the sandbox runs as. A task's runner builds its context from the configuration recorded with the
task; service-level work (recovery, prune) uses the process's own."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.config.settings import Config
from bridge.host.state_root import make_private
from bridge.sandbox import LABEL, Sandbox, home_id
from bridge.store import Store

if TYPE_CHECKING:
    from bridge.cluster.link import Nodes


@dataclass
class Context:
    config: Config
    store: Store
    sandbox: Sandbox
    nodes: Nodes | None = None  # a cluster's nodes given (tests); else config `cluster` names them

    def __post_init__(self) -> None:
        # A detached runner or coordinator starts here, from a recorded configuration: the
        # state root is made private before it is used, as the facade does.
        make_private(self.config.home)
        # The engine's containers may come from the pool (bridge/sandbox/pool.py): whatever
        # the pool's size, claimed pooled containers are found by their task's labels.
        from bridge.sandbox.pool import pooled

        slots = getattr(self.store, "pool", None)
        if slots is not None:
            self.sandbox = pooled(self.sandbox, slots, self.config.home, self.config.pool)

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

    def with_config(self, config: Config) -> Context:
        return Context(config, self.store, self.sandbox, self.nodes)
