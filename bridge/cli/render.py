"""How the CLI prints task results and events for people (--json prints the documents)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from bridge.display import describe_request, one_line, terminal_safe

if TYPE_CHECKING:  # the CLI's SafeStream loads this module at start-up: no pydantic there
    from bridge.documents import BinaryNote
    from bridge.records import CommandResult, Event, TaskResult


class SafeStream:
    """A text stream for people: whatever a worker put into a summary, a path or an output
    tail is shown, never interpreted by the terminal."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(terminal_safe(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def out_json(doc: Any) -> None:
    """One JSON document; every character outside printable ASCII escaped (\\uXXXX), so the
    text is all there and nothing in it reaches a terminal raw."""
    sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=True) + "\n")


def print_shown(result: TaskResult, as_json: bool) -> None:
    """`tasks show`: the task result as JSON or for people."""
    if as_json:
        out_json(result.document())
    else:
        print_result(result)


def print_tasks(tasks: list[TaskResult], as_json: bool) -> None:
    """`tasks list`: the task results as one JSON document, or a line each."""
    if as_json:
        out_json({"tasks": [task.document() for task in tasks]})
        return
    for task in tasks:
        pending = sum(1 for r in task.requests if r["status"] == "pending")
        asks = f"{pending} ask" if pending else "-"
        print(
            f"{task.task_id}  {task.status:<13} {task.worker:<10} {asks:<6} "
            f"{task.created_at}  {one_line(task.objective.strip()[:60])}"
        )


def _binary(note: BinaryNote | None) -> str:
    """What a changed file git shows as binary says beside its name."""
    if note is None:
        return ""
    counted = f"+{note['lines_added']} -{note['lines_removed']} lines counted"
    if note["flagged"]:
        return f"  [binary: its text, escaped, is in artifacts.readable; {counted}]"
    return f"  [binary, as in the base; {counted}]"


def print_result(result: TaskResult) -> None:
    f = one_line
    print(f"task {result.task_id}: {result.status}")
    print(f"  worker: {f(result.worker)}   objective: {f(result.objective.strip()[:200])}")
    profile = result.profile
    if profile:
        filled = ", ".join(profile["filled"]) or "nothing (every field was given)"
        print(f"  type: {f(profile['type'])}   its profile filled: {f(filled)}")
    if result.worker_node or result.verify_node:  # a cluster's (docs/cluster.md)
        where = f"  worker ran on node {f(result.worker_node or '-')}"
        print(where + f", checks on node {f(result.verify_node or '-')}")
    if result.summary:
        print(f"  summary: {f(result.summary.strip()[:500])}")
    if result.error:
        print(f"  error ({result.error.kind}): {f(result.error.message)}")
    if result.changed_files:
        print("  changed files:")
        for entry in result.changed_files:
            extra = f" (from {f(entry.from_)})" if entry.from_ else ""
            print(f"    {entry.change:<12} {f(entry.path)}{extra}{_binary(entry.binary)}")
    for dropped in result.dropped:
        print(f"  left out: {f(dropped['path'])} ({f(dropped['reason'])})")
    verification = result.verification
    if verification is not None:
        ok = verification.ok
        label = {True: "ok", False: "FAILED", None: "none (no verify commands)"}[ok]
        print(f"  verification: {label}")
        for cmd in verification.commands:
            print(f"    [{_mark(cmd)}] {f(cmd.command)} ({cmd.duration_s} s)")
    usage = result.usage
    if usage:
        tokens = ", ".join(
            f"{f(model)} {t['input']} in / {t['output']} out"
            for model, t in (usage.get("tokens") or {}).items()
        )
        print(
            f"  network: {usage['requests']} request(s), {usage['bytes_up']} B up, "
            f"{usage['bytes_down']} B down" + (f"; tokens: {tokens}" if tokens else "")
        )
    if result.allowlist:
        print(f"  allowlist: {f(', '.join(result.allowlist))}")
    if result.approved_paths:
        print(f"  approved protected paths: {f(', '.join(result.approved_paths))}")
    for request in result.requests:
        print(
            f"  request {request['request_id']} ({request['kind']}, {request['status']}): "
            f"{f(describe_request(request, request.get('attempts', 1)))}"
        )
    pending = [r for r in result.requests if r["status"] == "pending"]
    if pending:
        print(
            f"  answer: worker-bridge tasks answer {result.task_id} "
            f"{pending[0]['request_id']} (--approve | --deny | --text TEXT)"
        )
    for name, path in result.artifacts.items():
        print(f"  {name}: {path}")


def _mark(cmd: CommandResult) -> str:
    status = cmd.status or ("passed" if cmd.exit_code == 0 else "failed")
    if status == "passed":
        return "pass"
    if status == "failed":
        return f"exit {cmd.exit_code}"
    return status.replace("_", " ")  # timed out, not run, out of memory, over limit


def print_event(event: Event) -> None:
    data = event.data
    if event.kind == "worker.progress":
        head = data.get("kind", "message") + (f" {data['name']}" if data.get("name") else "")
        text = one_line(f"[{head}] {data.get('text', data.get('line', ''))}")
    else:
        text = json.dumps(data, ensure_ascii=False)
    print(f"{event.event_id:>6} {event.at} {event.kind:<22} {text}")
