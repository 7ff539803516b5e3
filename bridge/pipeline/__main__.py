"""A detached runner process: `python -m bridge.pipeline --store PATH TASK_ID RUNNER_ID` (see
detached.py). It runs with the configuration recorded with the task."""

import argparse
import sys
from pathlib import Path

from bridge.pipeline.process import run_reserved


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bridge.pipeline")
    parser.add_argument("--store", required=True, type=Path, help="the SQLite store's path")
    parser.add_argument("task_id")
    parser.add_argument("runner_id")
    args = parser.parse_args(argv)
    if not args.store.is_file():  # the state root went away before this process started
        print(f"no store at {args.store}: nothing to run", file=sys.stderr)
        return 0
    run_reserved(args.store, args.task_id, args.runner_id)
    return 0


sys.exit(main(sys.argv[1:]))
