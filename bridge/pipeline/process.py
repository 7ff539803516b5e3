"""The body of a detached runner process (`python -m bridge.pipeline`): run a task under a
reservation `detached.spawn_runner` made, with the task's own configuration and the Docker
engine. Kept apart from detached.py, which the runner's recovery path imports."""

from __future__ import annotations

from pathlib import Path

from bridge.phase.context import Context
from bridge.phase.handle import PipelineHooks
from bridge.pipeline.runner import TaskRunner
from bridge.records import TaskRecord
from bridge.store import Store
from bridge.store.owners import Owner


def run_reserved(
    store_path: Path, task_id: str, runner_id: str, hooks: PipelineHooks | None = None
) -> TaskRecord:
    """The body of a detached runner: run the task under its reservation, with the task's own
    configuration and the Docker engine."""
    from bridge.sandbox.docker import DockerSandbox, resolved_once

    store = Store(store_path)
    try:
        config = store.load_task(task_id).config
        ctx = Context(config, store, DockerSandbox())
        with resolved_once():  # the run's images, each looked up once
            return TaskRunner(ctx, task_id, Owner(id=runner_id), hooks=hooks).run()
    finally:
        store.close()
