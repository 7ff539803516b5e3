"""A detached runner for crash tests: `python tests/support/paused_runner.py STORE TASK PHASE`.

It starts a created task the way `worker-bridge tasks start` does (reserve, queue), then runs it
in this process with an injected hook that, on entering PHASE, emits `test.paused` with this
process's pid and waits to be killed. Production code has no pause point of its own.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bridge.models import Status
from bridge.phase.handle import PipelineHooks
from bridge.pipeline.detached import reserve_runner
from bridge.pipeline.process import run_reserved
from bridge.store import Store

PAUSE_S = 120


class PauseAt(PipelineHooks):
    def __init__(self, phase: str) -> None:
        self.phase = phase

    def phase_entered(self, handle, phase: str) -> None:  # noqa: ANN001
        if phase == self.phase:
            handle.emit("test.paused", {"phase": phase, "pid": os.getpid()})
            time.sleep(PAUSE_S)


def main(store_path: str, task_id: str, phase: str) -> int:
    store = Store(store_path)
    try:
        runner_id = reserve_runner(store, task_id, store.load_task(task_id).runner_id)
        if runner_id is None or not store.transition(
            task_id, Status.QUEUED, expect={Status.CREATED}
        ):
            print(f"task {task_id} could not be started", file=sys.stderr)
            return 1
    finally:
        store.close()
    run_reserved(Path(store_path), task_id, runner_id, hooks=PauseAt(phase))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
