"""The `worker-bridge` command: a thin layer over WorkerBridge.

Exit codes: 0 success; 1 the task failed or was refused; 2 usage, configuration or invalid spec.
With --json, stdout carries exactly one JSON document.
"""

from __future__ import annotations

import argparse
import sys

from bridge.cli import commands as c
from bridge.cli.render import SafeStream
from bridge.errors import BridgeError
from bridge.mcp_http import add_arguments as add_mcp_transport_arguments
from bridge.sandbox.host_paths import require_state_root
from bridge.service import WorkerBridge


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"worker-bridge: {message} (see `{self.prog} --help`)\n")


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
    p.set_defaults(func=c.cmd_tasks_create)
    p = tsub.add_parser("run", help="create a task and run it to the end")
    _task_flags(p)
    p.set_defaults(func=c.cmd_tasks_run)
    p = tsub.add_parser("start", help="start a created task")
    p.add_argument("task_id")
    p.add_argument("--wait", action="store_true", help="run in this process until it ends")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_tasks_start)
    p = tsub.add_parser("show", help="show a task result")
    p.add_argument("task_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_tasks_show)
    p = tsub.add_parser("list", help="list tasks, newest first")
    p.add_argument("--status")
    p.add_argument("--limit", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_tasks_list)
    p = tsub.add_parser("logs", help="a task's events")
    p.add_argument("task_id")
    p.add_argument("--follow", action="store_true", help="keep printing until the task ends")
    p.add_argument("--after", type=int, default=0, help="only events after this event id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_tasks_logs)
    p = tsub.add_parser("accept", help="write a verified snapshot into the working tree")
    p.add_argument("task_id")
    p.add_argument("--allow-unverified", action="store_true")
    p.add_argument(
        "--no-reverify",
        action="store_true",
        help="when HEAD moved past the task's base, write without running the checks on it",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_tasks_accept)

    p = tsub.add_parser("follow-up", help="another worker turn on a finished task's worktree")
    p.add_argument("task_id")
    p.add_argument("message", help="what the worker should change next")
    p.add_argument("--wait", action="store_true", help="wait for the turn to end")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_tasks_follow_up)
    p = tsub.add_parser("reject", help="reject a succeeded task's change")
    p.add_argument("task_id")
    p.add_argument("--reason", default="", help="why (recorded with the task)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_tasks_reject)

    p = tsub.add_parser("cancel", help="cancel a task and kill its containers")
    p.add_argument("task_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_tasks_cancel)

    spaces = sub.add_parser("workspaces", help="reclaim worktrees, branches and artifacts")
    ssub = spaces.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = ssub.add_parser("prune", help="reclaim what finished tasks left (dry run by default)")
    p.add_argument("--apply", action="store_true", help="remove, rather than list")
    p.add_argument(
        "--include-unaccepted",
        action="store_true",
        help="also reclaim succeeded tasks whose work was not accepted",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_workspaces_prune)

    envs = sub.add_parser("environments", help="show and reclaim project environment caches")
    esub = envs.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = esub.add_parser("list", help="the setup caches, most recently used first")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_environments_list)
    p = esub.add_parser("prune", help="reclaim unused setup caches (dry run by default)")
    p.add_argument("--apply", action="store_true", help="remove, rather than list")
    p.add_argument(
        "--all", action="store_true", help="every cache entry and built environment image"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_environments_prune)

    workers = sub.add_parser("workers", help="list and link workers")
    wsub = workers.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = wsub.add_parser("list")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_workers_list)
    p = wsub.add_parser("link", help="register a command-line agent as a worker")
    p.add_argument("name")
    p.add_argument("--command-json", required=True, help='e.g. \'["my-agent","run","{prompt}"]\'')
    p.add_argument("--image", help="image to run it in (default: the base image)")
    p.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="NAME",
        help="a gateway model route it uses (repeatable), e.g. anthropic",
    )
    p.set_defaults(func=c.cmd_workers_link)

    images = sub.add_parser("images", help="build the worker-bridge images")
    isub = images.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = isub.add_parser("build", help="build base, verify and worker images")
    p.add_argument("names", nargs="*", metavar="NAME", help="base, verify or a worker name")
    p.add_argument("--base-image", help="BASE_IMAGE for the base image (a local ref works)")
    p.add_argument(
        "--all", action="store_true", help="every image: base, verify, mock and each worker CLI"
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="then run one task in each worker image built (each CLI against a scripted model)",
    )
    p.set_defaults(func=c.cmd_images_build)

    p = sub.add_parser("doctor", help="check that tasks can run here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_doctor)
    p = sub.add_parser("mcp", help="run the MCP server (stdio, or streamable HTTP with --http)")
    add_mcp_transport_arguments(p)
    p.set_defaults(func=c.cmd_mcp)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    streams = sys.stdout, sys.stderr
    if args.group != "mcp":  # the MCP server's stdout carries the protocol, not text for people
        sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr)  # type: ignore
    bridge = None
    try:
        bridge = WorkerBridge()
        if args.group in ("tasks", "workspaces", "jobs"):
            require_state_root(bridge.config.home)  # in a container: shared with the host?
            bridge.recover()  # any command resolves tasks whose runner died
        return args.func(bridge, args)
    except BridgeError as exc:
        print(f"worker-bridge: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("worker-bridge: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout, sys.stderr = streams
        if bridge is not None:
            bridge.close()


if __name__ == "__main__":
    sys.exit(main())
