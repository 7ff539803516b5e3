"""Entry point of a detached runner process: `python -m bridge.pipeline.detached TASK_ID`.
It loads the configuration the same way every other entry point does."""

from __future__ import annotations

import sys

from bridge.service import WorkerBridge


def main(argv: list[str]) -> int:
    bridge = WorkerBridge()
    try:
        bridge.run_task(argv[0])
    finally:
        bridge.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
