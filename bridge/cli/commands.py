"""The CLI's task commands: each turns parsed arguments into one WorkerBridge call and prints it
(the jobs' are in jobs.py, those about the host in admin.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.cli.render import (
    out_json,
    print_event,
    print_result,
    print_shown,
    print_tasks,
)
from bridge.errors import InvalidSpec
from bridge.models import TERMINAL, JsonObject, Status
from bridge.records import Event, TaskResult
from bridge.service import WorkerBridge

if TYPE_CHECKING:
    from bridge.cli.live import LiveView


def _spec_from_args(args: argparse.Namespace) -> JsonObject:
    """The task spec document of the flags and the --spec file (validated by creation)."""
    spec: JsonObject = {}
    if args.spec:
        try:
            spec = json.loads(Path(args.spec).read_text())
        except FileNotFoundError as exc:
            raise InvalidSpec(f"Spec file {args.spec} does not exist.") from exc
        except ValueError as exc:
            raise InvalidSpec(f"Spec file {args.spec} is not valid JSON ({exc}).") from exc
        if not isinstance(spec, dict):
            raise InvalidSpec(f"Spec file {args.spec} must hold a JSON object.")
    if args.objective is not None:
        spec["objective"] = args.objective
    if args.worker is not None:
        spec["worker"] = args.worker
    workspace = spec.setdefault("workspace", {})
    if not isinstance(workspace, dict):
        raise InvalidSpec("workspace in the task spec must be an object.")
    if args.repo is not None:
        workspace["repository"] = str(Path(args.repo).expanduser().absolute())
    if args.base_ref is not None:
        workspace["base_ref"] = args.base_ref
    if args.verify:
        spec.setdefault("verification", {})["commands"] = args.verify
    if args.protect:
        spec.setdefault("verification", {})["protected_paths"] = args.protect
    if args.permission is not None:
        spec["permission"] = args.permission
    if args.priority is not None:
        spec["priority"] = args.priority
    if args.timeout is not None:
        spec.setdefault("limits", {})["timeout_seconds"] = args.timeout
    if args.metadata_json is not None:
        try:
            extra = json.loads(args.metadata_json)
        except ValueError as exc:
            raise InvalidSpec(f"--metadata-json is not valid JSON ({exc}).") from exc
        if not isinstance(extra, dict):
            raise InvalidSpec("--metadata-json must be a JSON object.")
        spec.setdefault("metadata", {}).update(extra)
    if args.type is not None:
        spec.setdefault("metadata", {})["type"] = args.type
    if args.spec:
        return spec  # the spec's own validation names what is missing or unknown
    if "objective" not in spec:
        raise InvalidSpec("--objective is required (or give --spec FILE with an objective).")
    if not workspace.get("repository"):
        raise InvalidSpec("--repo is required (or give --spec FILE with workspace.repository).")
    return spec


def cmd_tasks_create(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    result = bridge.create_task(_spec_from_args(args))
    if args.json:
        out_json(result.document())
    else:
        print(result.task_id)
    return 0


def _finish(result: TaskResult, args: argparse.Namespace) -> int:
    if args.json:
        out_json(result.document())
    else:
        print_result(result)
    if result.status == Status.WAITING_INPUT:
        pending = [r["request_id"] for r in result.requests if r["status"] == "pending"]
        print(
            f"worker-bridge: task {result.task_id} is waiting for input; answer "
            + ", ".join(pending)
            + f" with `worker-bridge tasks answer {result.task_id} REQUEST_ID "
            "(--approve | --deny | --text TEXT)`",
            file=sys.stderr,
        )
        return 1
    if result.status != "succeeded":
        reason = (result.error.message if result.error else None) or f"status {result.status}"
        print(
            f"worker-bridge: task {result.task_id} {result.status}: {reason}",
            file=sys.stderr,
        )
        return 1
    return 0


def _run_in_foreground(bridge: WorkerBridge, task_id: str, args: argparse.Namespace) -> int:
    """Run to the end in this process; Ctrl-C cancels the task rather than stranding it."""
    try:
        with _live(bridge, task_id, args) as view:
            # The view follows the task once this process runs it: refused, or claimed by
            # another process first, this command shows none of that run's events.
            result = bridge.run_task(task_id, on_claimed=view.start if view else None)
    except KeyboardInterrupt:
        result = bridge.cancel_task(task_id)
    return _finish(result, args)


def _live(
    bridge: WorkerBridge, task_id: str, args: argparse.Namespace
) -> AbstractContextManager[LiveView | None]:
    """The live view of a task this command waits for (nothing with --json)."""
    if args.json:
        return nullcontext()
    from bridge.cli.live import LiveView

    return LiveView(bridge, task_id)


def cmd_tasks_run(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    created = bridge.create_task(_spec_from_args(args))
    return _run_in_foreground(bridge, created.task_id, args)


def cmd_tasks_start(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    if args.wait:
        return _run_in_foreground(bridge, args.task_id, args)
    result = bridge.start_detached(args.task_id)
    if args.json:
        out_json(result.document())
    else:
        print(
            f"task {result.task_id}: {result.status} (running in the background; "
            f"`worker-bridge tasks show {result.task_id}`)"
        )
    return 0


def cmd_tasks_show(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    print_shown(bridge.get_task(args.task_id), args.json)
    return 0


def cmd_tasks_list(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    print_tasks(bridge.list_tasks(status=args.status, limit=args.limit), args.json)
    return 0


def cmd_tasks_answer(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    chosen = [flag for flag in ("approve", "deny") if getattr(args, flag)]
    if len(chosen) + (args.text is not None) != 1:
        raise InvalidSpec("Answer with exactly one of --approve, --deny or --text TEXT.")
    decision = chosen[0] if chosen else None
    result = bridge.answer(args.task_id, args.request_id, decision=decision, text=args.text)
    if args.json:
        out_json(result.document())
    else:
        print(f"task {result.task_id}: {result.status} (request {args.request_id} answered)")
    return 0


def cmd_tasks_logs(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    after = args.after
    collected: list[Event] = []
    while True:
        page = bridge.task_logs(args.task_id, after=after, limit=500)
        for event in page.events:
            if args.json:
                collected.append(event)
            else:
                print_event(event)
        after = page.next_after
        if page.events:
            if args.follow and not args.json:
                sys.stdout.flush()  # a reader at the other end of a pipe sees each event now
            continue
        if not args.follow or bridge.task_status(args.task_id) in TERMINAL:
            # one last page: events written just before the terminal status
            if args.follow and bridge.task_logs(args.task_id, after=after).events:
                continue
            break
        time.sleep(0.25)
    if args.json:
        out_json({"events": [e.document() for e in collected], "next_after": after})
    return 0


def cmd_tasks_accept(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    outcome = bridge.accept_task(
        args.task_id, allow_unverified=args.allow_unverified, reverify=not args.no_reverify
    ).document()
    if args.json:
        out_json(outcome)
    if not outcome["accepted"]:
        print(f"worker-bridge: {outcome['reason']}", file=sys.stderr)
        return 1
    if not args.json:
        print(
            f"task {args.task_id}: accepted; {len(outcome['applied'])} file(s) written to the "
            "working tree as uncommitted changes"
        )
        if outcome["reverified"] is True:
            print(
                f"  HEAD moved since the task's base; the checks passed on {outcome['head'][:12]}"
            )
        elif outcome["reverified"] is False:
            print(
                f"  warning: HEAD moved since the task's base; the change is unverified on "
                f"{outcome['head'][:12]} (--no-reverify)"
            )
        for path in outcome["applied"]:
            print(f"  {path}")
    return 0


def cmd_tasks_follow_up(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    if args.wait:  # the turn runs in this process: Ctrl-C cancels it, as for `tasks run`
        try:
            with _live(bridge, args.task_id, args) as view:
                start = view.start if view else None
                result = bridge.follow_up(args.task_id, args.message, wait=True, on_claimed=start)
        except KeyboardInterrupt:
            result = bridge.cancel_task(args.task_id)
        return _finish(result, args)
    result = bridge.follow_up(args.task_id, args.message)
    if args.json:
        out_json(result.document())
    else:
        print(f"task {result.task_id}: {result.status} (follow-up turn queued)")
    return 0


def cmd_tasks_reject(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    result = bridge.reject_task(args.task_id, args.reason)
    refused = f"is {result.status}; only a succeeded task can be rejected."
    return _ended(result, args, "rejected", refused, f"task {args.task_id}: rejected")


def cmd_tasks_cancel(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    before = bridge.task_status(args.task_id)
    result = bridge.cancel_task(args.task_id)
    note = " (it was already cancelled)" if before == "cancelled" else ""
    refused = f"already ended {result.status}; nothing to cancel."
    return _ended(result, args, "cancelled", refused, f"task {args.task_id}: cancelled{note}")


def _ended(
    result: TaskResult, args: argparse.Namespace, wanted: str, refused: str, done: str
) -> int:
    """A verb that ends a task: its result, then 0 when it reached ``wanted``, else 1 with
    the one line saying why not."""
    if args.json:
        out_json(result.document())
    if result.status != wanted:
        print(f"worker-bridge: task {args.task_id} {refused}", file=sys.stderr)
        return 1
    if not args.json:
        print(done)
    return 0


def cmd_tasks_recover(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    # main() already recovered (this command acts); say what it handed on
    recovered = getattr(args, "recovered", [])
    if args.json:
        out_json({"recovered": recovered})
    elif recovered:
        for found in recovered:  # task ids, then job ids (job-...)
            if found.startswith("job-"):
                print(f"job {found}: its coordinator had died; a new one resumes it")
            else:
                print(f"task {found}: its runner had died; a new one resumes it")
    else:
        print("no task had lost its runner")
    return 0
