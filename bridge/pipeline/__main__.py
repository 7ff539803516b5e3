"""A detached runner process: `python -m bridge.pipeline TASK_ID RUNNER_ID` (see detached.py).
It loads the configuration the same way every other entry point does."""

import sys

from bridge.service import WorkerBridge


def main(argv: list[str]) -> int:
    task_id, runner_id = argv[0], argv[1]
    bridge = WorkerBridge()
    try:
        bridge.run_task(task_id, runner_id=runner_id)
    finally:
        bridge.close()
    return 0


sys.exit(main(sys.argv[1:]))
