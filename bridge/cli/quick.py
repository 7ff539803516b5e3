"""The reads that answer without the facade when they can (bridge/reads.py): `tasks show` and
`tasks list` print the same as theirs in commands.py, and return None to let those run."""

from __future__ import annotations

import argparse

from bridge import reads
from bridge.cli.render import print_shown, print_tasks


def show(args: argparse.Namespace) -> int | None:
    result = reads.show_task(args.task_id)
    if result is None:
        return None
    print_shown(result, args.json)
    return 0


def list_(args: argparse.Namespace) -> int | None:
    tasks = reads.list_tasks(status=args.status, limit=args.limit)
    if tasks is None:
        return None
    print_tasks(tasks, args.json)
    return 0
