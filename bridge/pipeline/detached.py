"""Detached runner processes: `python -m bridge.pipeline.detached TASK_ID RUNNER_ID`.

`spawn_runner` reserves the task for a new runner id, then starts the process, which claims the
task under that id. It loads the configuration the same way every other entry point does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from bridge.config import Config
from bridge.store import Store

STARTUP_GRACE = 30.0  # seconds a reservation holds before the process has claimed it


def spawn_runner(config: Config, store: Store, task_id: str, replacing: str | None) -> bool:
    """Start a detached runner for ``task_id``. ``replacing`` is the runner id the caller saw
    on the task (None for a new task): the reservation is a compare-and-set on it, so of
    several processes recovering one task, only one spawns a runner."""
    runner_id = f"runner-{uuid.uuid4().hex[:12]}"
    if not store.runners.reserve(task_id, runner_id, STARTUP_GRACE, replacing):
        return False
    logs = config.home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(config.home)}
    with open(logs / f"runner-{task_id}.log", "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "bridge.pipeline.detached", task_id, runner_id],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    return True


def main(argv: list[str]) -> int:
    from bridge.service import WorkerBridge

    task_id, runner_id = argv[0], argv[1]
    bridge = WorkerBridge()
    try:
        bridge.run_task(task_id, runner_id=runner_id)
    finally:
        bridge.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
