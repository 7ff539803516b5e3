"""Detached runner processes (`python -m bridge.pipeline --store PATH TASK_ID RUNNER_ID`).

`spawn_runner` reserves the task for a new runner id, then starts the process, which claims the
task under that id. The process needs nothing but the store's path: it runs with the
configuration recorded with the task, so what the caller configured is what runs.
"""

from __future__ import annotations

import os
import subprocess
import sys

from bridge.config.settings import Config
from bridge.store import Store
from bridge.store.owners import new_runner_id

STARTUP_GRACE = 30.0  # seconds a reservation holds before the process has claimed it


def reserve_runner(
    store: Store, task_id: str, replacing: str | None, *, finished_ok: bool = False
) -> str | None:
    """Reserve the task for a runner about to start: a compare-and-set on the runner id the
    caller saw (``replacing``; None for a new task), so of several processes recovering one
    task, only one wins. Returns the new runner id, or None when another process won."""
    runner_id = new_runner_id()
    taken = store.runners.reserve(
        task_id, runner_id, STARTUP_GRACE, replacing, finished_ok=finished_ok
    )
    return runner_id if taken else None


def launch_detached(config: Config, module: str, log_name: str, *args: str) -> None:
    """Start ``python -m MODULE --store PATH ARGS...`` in a session of its own (it outlives the
    caller), its output appended to ``<home>/logs/LOG_NAME``: a task's runner or a job's
    coordinator (bridge/jobs/detached.py)."""
    logs = config.home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # -P: the caller's working folder is not put first on the path, so a `bridge` package in
    # it (a repository's own, or one a worker wrote there) is never what the runner imports
    argv = [sys.executable, "-P", "-m", module, "--store", str(config.store_path), *args]
    with open(logs / log_name, "ab") as log:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=dict(os.environ),
            start_new_session=True,
            close_fds=True,
        )


def launch_runner(config: Config, task_id: str, runner_id: str) -> None:
    """Start the detached runner process for a reservation."""
    launch_detached(config, "bridge.pipeline", f"runner-{task_id}.log", task_id, runner_id)


def spawn_runner(config: Config, store: Store, task_id: str, replacing: str | None) -> bool:
    """Reserve and launch a detached runner for ``task_id``; False if another process won."""
    runner_id = reserve_runner(store, task_id, replacing)
    if runner_id is None:
        return False
    launch_runner(config, task_id, runner_id)
    return True
