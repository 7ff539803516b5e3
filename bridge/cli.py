"""The `worker-bridge` command: a thin layer over WorkerBridge.

Exit codes: 0 success; 1 the task failed or was refused; 2 usage, configuration or invalid spec.
With --json, stdout carries exactly one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bridge.errors import BridgeError, InvalidSpec
from bridge.models import TERMINAL
from bridge.service import WorkerBridge


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"worker-bridge: {message} (see `{self.prog} --help`)\n")


def _out_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def _spec_from_args(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {}
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
    workspace = (
        spec.setdefault("workspace", {})
        if isinstance(spec.get("workspace", {}), dict)
        else spec["workspace"]
    )
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


def _print_result(result: dict[str, Any]) -> None:
    print(f"task {result['task_id']}: {result['status']}")
    print(f"  worker: {result['worker']}   objective: {result['objective'].strip()[:200]}")
    if result.get("summary"):
        print(f"  summary: {result['summary'].strip()[:500]}")
    if result.get("error"):
        print(f"  error ({result['error']['kind']}): {result['error']['message']}")
    if result["changed_files"]:
        print("  changed files:")
        for entry in result["changed_files"]:
            extra = f" (from {entry['from']})" if entry.get("from") else ""
            print(f"    {entry['change']:<12} {entry['path']}{extra}")
    verification = result.get("verification")
    if verification is not None:
        ok = verification.get("ok")
        label = {True: "ok", False: "FAILED", None: "none (no verify commands)"}[ok]
        print(f"  verification: {label}")
        for cmd in verification.get("commands", []):
            mark = "pass" if cmd["exit_code"] == 0 else f"exit {cmd['exit_code']}"
            print(f"    [{mark}] {cmd['command']} ({cmd['duration_s']} s)")
    for name, path in result.get("artifacts", {}).items():
        print(f"  {name}: {path}")


def _print_event(event: dict[str, Any]) -> None:
    data = event["data"]
    if event["kind"] == "worker.progress":
        text = data.get("line", "")
    else:
        text = json.dumps(data, ensure_ascii=False)
    print(f"{event['event_id']:>6} {event['at']} {event['kind']:<22} {text}")


# -- commands -------------------------------------------------------------------------------


def cmd_tasks_create(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    result = bridge.create_task(_spec_from_args(args))
    if args.json:
        _out_json(result)
    else:
        print(result["task_id"])
    return 0


def _finish(result: dict[str, Any], args: argparse.Namespace) -> int:
    if args.json:
        _out_json(result)
    else:
        _print_result(result)
    if result["status"] != "succeeded":
        reason = (result.get("error") or {}).get("message") or f"status {result['status']}"
        print(
            f"worker-bridge: task {result['task_id']} {result['status']}: {reason}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_tasks_run(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    created = bridge.create_task(_spec_from_args(args))
    return _finish(bridge.run_task(created["task_id"]), args)


def cmd_tasks_start(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    if args.wait:
        return _finish(bridge.run_task(args.task_id), args)
    result = bridge.start_detached(args.task_id)
    if args.json:
        _out_json(result)
    else:
        print(
            f"task {result['task_id']}: {result['status']} (running in the background; "
            f"`worker-bridge tasks show {result['task_id']}`)"
        )
    return 0


def cmd_tasks_show(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    result = bridge.get_task(args.task_id)
    if args.json:
        _out_json(result)
    else:
        _print_result(result)
    return 0


def cmd_tasks_list(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    tasks = bridge.list_tasks(status=args.status, limit=args.limit)
    if args.json:
        _out_json({"tasks": tasks})
        return 0
    for task in tasks:
        print(
            f"{task['task_id']}  {task['status']:<10} {task['worker']:<10} "
            f"{task['created_at']}  {task['objective'].strip()[:60]}"
        )
    return 0


def cmd_tasks_logs(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    after = args.after
    collected: list[dict[str, Any]] = []
    while True:
        page = bridge.task_logs(args.task_id, after=after, limit=500)
        for event in page["events"]:
            if args.json:
                collected.append(event)
            else:
                _print_event(event)
        after = page["next_after"]
        if page["events"]:
            continue
        if not args.follow or bridge.get_task(args.task_id)["status"] in TERMINAL:
            # one last page: events written just before the terminal status
            if args.follow and bridge.task_logs(args.task_id, after=after)["events"]:
                continue
            break
        time.sleep(0.25)
    if args.json:
        _out_json({"events": collected, "next_after": after})
    return 0


def cmd_tasks_accept(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    outcome = bridge.accept_task(args.task_id, allow_unverified=args.allow_unverified)
    if args.json:
        _out_json(outcome)
    if not outcome["accepted"]:
        print(f"worker-bridge: {outcome['reason']}", file=sys.stderr)
        return 1
    if not args.json:
        print(
            f"task {args.task_id}: accepted; {len(outcome['applied'])} file(s) written to the "
            "working tree as uncommitted changes"
        )
        for path in outcome["applied"]:
            print(f"  {path}")
    return 0


def cmd_workers_list(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    workers = bridge.list_workers()
    if args.json:
        _out_json({"workers": workers})
        return 0
    for w in workers:
        state = "installed" if w["installed"] else "not built"
        print(f"{w['name']:<14} {state:<10} {w['image']}")
    return 0


def cmd_workers_link(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    try:
        command = json.loads(args.command_json)
    except ValueError as exc:
        raise InvalidSpec(f"--command-json is not valid JSON ({exc}).") from exc
    if not isinstance(command, list):
        raise InvalidSpec("--command-json must be a JSON list of strings.")
    bridge.link_worker(args.name, command, args.image)
    print(f"linked worker '{args.name}'")
    return 0


def cmd_images_build(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    from bridge.sandbox.images import build_images

    tags = build_images(
        bridge.config,
        bridge.sandbox,
        args.names or None,
        args.base_image,
        on_line=lambda line: print(line, flush=True),
    )
    print("built: " + ", ".join(tags))
    return 0


def cmd_doctor(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    from bridge.doctor import run_doctor

    return run_doctor(bridge, as_json=args.json)


def cmd_mcp(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    from bridge.mcp_server import main as mcp_main

    return mcp_main([])


# -- parser ---------------------------------------------------------------------------------


def _task_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--objective", help="what the worker should do")
    p.add_argument("--repo", help="path to the git repository (made absolute)")
    p.add_argument("--worker", help="worker name (`workers list`)")
    p.add_argument("--verify", action="append", metavar="CMD", help="verify command (repeatable)")
    p.add_argument(
        "--protect", action="append", metavar="GLOB", help="protected path pattern (repeatable)"
    )
    p.add_argument("--type", choices=["chore", "feature", "hotfix", "refactor"])
    p.add_argument("--spec", metavar="FILE", help="JSON task spec; flags override its fields")
    p.add_argument("--priority", type=int)
    p.add_argument("--timeout", type=int, metavar="S", help="deadline for the whole task")
    p.add_argument("--base-ref", help="commit-ish to start from (default HEAD)")
    p.add_argument("--permission", choices=["read_only", "workspace_write", "full_access"])
    p.add_argument("--metadata-json", metavar="JSON", help="merged into the spec's metadata")
    p.add_argument("--json", action="store_true", help="print the task result as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="worker-bridge", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="group", required=True, parser_class=_Parser)

    tasks = sub.add_parser("tasks", help="create, run and inspect tasks")
    tsub = tasks.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = tsub.add_parser("create", help="validate and record a task; prints its id")
    _task_flags(p)
    p.set_defaults(func=cmd_tasks_create)
    p = tsub.add_parser("run", help="create a task and run it to the end")
    _task_flags(p)
    p.set_defaults(func=cmd_tasks_run)
    p = tsub.add_parser("start", help="start a created task")
    p.add_argument("task_id")
    p.add_argument("--wait", action="store_true", help="run in this process until it ends")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tasks_start)
    p = tsub.add_parser("show", help="show a task result")
    p.add_argument("task_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tasks_show)
    p = tsub.add_parser("list", help="list tasks, newest first")
    p.add_argument("--status")
    p.add_argument("--limit", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tasks_list)
    p = tsub.add_parser("logs", help="a task's events")
    p.add_argument("task_id")
    p.add_argument("--follow", action="store_true", help="keep printing until the task ends")
    p.add_argument("--after", type=int, default=0, help="only events after this event id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tasks_logs)
    p = tsub.add_parser("accept", help="write a verified snapshot into the working tree")
    p.add_argument("task_id")
    p.add_argument("--allow-unverified", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tasks_accept)

    workers = sub.add_parser("workers", help="list and link workers")
    wsub = workers.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = wsub.add_parser("list")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_workers_list)
    p = wsub.add_parser("link", help="register a command-line agent as a worker")
    p.add_argument("name")
    p.add_argument("--command-json", required=True, help='e.g. \'["my-agent","run","{prompt}"]\'')
    p.add_argument("--image", help="image to run it in (default: the base image)")
    p.set_defaults(func=cmd_workers_link)

    images = sub.add_parser("images", help="build the worker-bridge images")
    isub = images.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = isub.add_parser("build", help="build base, verify and worker images")
    p.add_argument("names", nargs="*", metavar="NAME", help="base, verify or a worker name")
    p.add_argument("--base-image", help="BASE_IMAGE for the base image (a local ref works)")
    p.set_defaults(func=cmd_images_build)

    p = sub.add_parser("doctor", help="check that tasks can run here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("mcp", help="run the MCP server on stdio")
    p.set_defaults(func=cmd_mcp)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bridge = None
    try:
        bridge = WorkerBridge()
        return args.func(bridge, args)
    except BridgeError as exc:
        print(f"worker-bridge: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("worker-bridge: interrupted", file=sys.stderr)
        return 130
    finally:
        if bridge is not None:
            bridge.close()


if __name__ == "__main__":
    sys.exit(main())
