"""The `worker-bridge` command: a thin layer over WorkerBridge.

Exit codes: 0 success; 1 the task failed or was refused; 2 usage, configuration or invalid spec.
With --json, stdout carries exactly one JSON document.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bridge.cli import commands as c
from bridge.cli import jobs as j
from bridge.cli.render import SafeStream
from bridge.cli.ui import add_arguments as add_ui_arguments
from bridge.cli.ui import cmd_ui
from bridge.errors import BridgeError
from bridge.mcp_http import add_arguments as add_mcp_transport_arguments
from bridge.service import WorkerBridge


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"worker-bridge: {message} (see `{self.prog} --help`)\n")


@dataclass(frozen=True)
class Arg:
    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclass(frozen=True)
class Command:
    """One CLI command: where it is (`group name`, or a group of its own), its arguments, the
    function in commands.py that runs it, and whether it acts (only a command that acts hands
    tasks whose runner died to new runners; one that reads starts nothing)."""

    group: str
    name: str | None
    help: str
    run: Callable[..., int]
    args: tuple[Arg, ...] = ()
    acts: bool = False


JSON = arg("--json", action="store_true", help="print JSON (one document on stdout)")
TASK_ID = arg("task_id")
TASK_FLAGS = (
    arg("--objective", help="what the worker should do"),
    arg("--repo", help="path to the git repository (made absolute)"),
    arg("--worker", help="worker name (`workers list`)"),
    arg("--verify", action="append", metavar="CMD", help="verify command (repeatable)"),
    arg("--protect", action="append", metavar="GLOB", help="protected path pattern (repeatable)"),
    arg("--type", choices=["chore", "feature", "hotfix", "refactor"]),
    arg("--spec", metavar="FILE", help="JSON task spec; flags override its fields"),
    arg("--priority", type=int),
    arg("--timeout", type=int, metavar="S", help="deadline for the whole task"),
    arg("--base-ref", help="commit-ish to start from (default HEAD)"),
    arg("--permission", choices=["read_only", "workspace_write", "full_access"]),
    arg("--metadata-json", metavar="JSON", help="merged into the spec's metadata"),
    arg("--json", action="store_true", help="print the task result as JSON"),
)
APPLY = arg("--apply", action="store_true", help="remove, rather than list")

GROUPS = {
    "tasks": "create, run and inspect tasks",
    "workspaces": "reclaim worktrees, branches and artifacts",
    "environments": "show and reclaim project environment caches",
    "workers": "list and link workers",
    "images": "build the worker-bridge images",
    "jobs": "several tasks together: compete, review, fanout and integrate",
}
JOB_ID = arg("job_id")
WAIT_JOB = arg("--wait", action="store_true", help="wait for the job, showing each task")
FANOUT_FLAGS = tuple(
    arg("--objective", action="append", metavar="TEXT", help="an objective (repeat, one per task)")
    if a.flags == ("--objective",)
    else a
    for a in TASK_FLAGS
)

# Every command: adding one is an entry here and its function in commands.py.
COMMANDS = (
    Command(
        "tasks",
        "create",
        "validate and record a task; prints its id",
        c.cmd_tasks_create,
        TASK_FLAGS,
        acts=True,
    ),
    Command(
        "tasks",
        "run",
        "create a task and run it to the end",
        c.cmd_tasks_run,
        TASK_FLAGS,
        acts=True,
    ),
    Command(
        "tasks",
        "start",
        "start a created task",
        c.cmd_tasks_start,
        (
            TASK_ID,
            arg("--wait", action="store_true", help="run in this process until it ends"),
            JSON,
        ),
        acts=True,
    ),
    Command("tasks", "show", "show a task result", c.cmd_tasks_show, (TASK_ID, JSON)),
    Command(
        "tasks",
        "list",
        "list tasks, newest first",
        c.cmd_tasks_list,
        (arg("--status"), arg("--limit", type=int), JSON),
    ),
    Command(
        "tasks",
        "logs",
        "a task's events",
        c.cmd_tasks_logs,
        (
            TASK_ID,
            arg("--follow", action="store_true", help="keep printing until the task ends"),
            arg("--after", type=int, default=0, help="only events after this event id"),
            JSON,
        ),
    ),
    Command(
        "tasks",
        "accept",
        "write a verified snapshot into the working tree",
        c.cmd_tasks_accept,
        (
            TASK_ID,
            arg("--allow-unverified", action="store_true"),
            arg(
                "--no-reverify",
                action="store_true",
                help="when HEAD moved past the task's base, write without running the checks on it",
            ),
            JSON,
        ),
        acts=True,
    ),
    Command(
        "tasks",
        "follow-up",
        "another worker turn on a finished task's worktree",
        c.cmd_tasks_follow_up,
        (
            TASK_ID,
            arg("message", help="what the worker should change next"),
            arg("--wait", action="store_true", help="wait for the turn to end"),
            JSON,
        ),
        acts=True,
    ),
    Command(
        "tasks",
        "reject",
        "reject a succeeded task's change",
        c.cmd_tasks_reject,
        (TASK_ID, arg("--reason", default="", help="why (recorded with the task)"), JSON),
        acts=True,
    ),
    Command(
        "tasks",
        "cancel",
        "cancel a task and kill its containers",
        c.cmd_tasks_cancel,
        (TASK_ID, JSON),
        acts=True,
    ),
    Command(
        "tasks",
        "recover",
        "hand tasks whose runner died to new runners (every command that acts does this first)",
        c.cmd_tasks_recover,
        (JSON,),
        acts=True,
    ),
    Command(
        "tasks",
        "retry",
        "a new task from a finished task's spec (linked to it), started in the background",
        j.cmd_tasks_retry,
        (TASK_ID, JSON),
        acts=True,
    ),
    Command(
        "jobs",
        "compete",
        "one objective on several workers; candidates ranked by our verification",
        j.cmd_jobs_compete,
        (
            *TASK_FLAGS,
            arg("--workers", metavar="A,B", help="comma-separated workers, one candidate each"),
            arg("--attempts", type=int, default=1, help="candidates per worker (default 1)"),
            arg("--judge", metavar="W", help="a read-only worker that ranks eligible candidates"),
            arg("--wait", action="store_true", help="wait for the job, showing each candidate"),
        ),
        acts=True,
    ),
    Command(
        "jobs",
        "review",
        "an implementer, then a read-only reviewer; requested changes become follow-ups",
        j.cmd_jobs_review,
        (
            *TASK_FLAGS,
            arg("--reviewer", required=True, metavar="W", help="the worker that reviews"),
            arg("--rounds", type=int, default=3, help="most reviews (default 3)"),
            arg("--wait", action="store_true", help="wait for the job, showing each task"),
        ),
        acts=True,
    ),
    Command(
        "jobs",
        "fanout",
        "several objectives on one base, one task each, in parallel within the limits",
        j.cmd_jobs_fanout,
        (*FANOUT_FLAGS, WAIT_JOB),
        acts=True,
    ),
    Command(
        "jobs",
        "integrate",
        "apply a job's chosen verified tasks one after another, verifying after each",
        j.cmd_jobs_integrate,
        (
            JOB_ID,
            arg("--tasks", required=True, metavar="A,B", help="tasks, in order"),
            WAIT_JOB,
            JSON,
        ),
        acts=True,
    ),
    Command("jobs", "show", "show a job result", j.cmd_jobs_show, (JOB_ID, JSON)),
    Command(
        "jobs", "list", "list jobs, newest first", j.cmd_jobs_list, (arg("--limit", type=int), JSON)
    ),
    Command(
        "jobs",
        "cancel",
        "cancel a job and every task of it",
        j.cmd_jobs_cancel,
        (JOB_ID, JSON),
        acts=True,
    ),
    Command(
        "jobs",
        "accept",
        "accept a job's best candidate (or --task) and reject the others",
        j.cmd_jobs_accept,
        (JOB_ID, arg("--task", metavar="TASK_ID", help="the candidate to accept"), JSON),
        acts=True,
    ),
    Command(
        "workspaces",
        "prune",
        "reclaim what finished tasks left (dry run by default)",
        c.cmd_workspaces_prune,
        (
            APPLY,
            arg(
                "--include-unaccepted",
                action="store_true",
                help="also reclaim succeeded tasks whose work was not accepted",
            ),
            JSON,
        ),
        acts=True,
    ),
    Command(
        "environments",
        "list",
        "the setup caches, most recently used first",
        c.cmd_environments_list,
        (JSON,),
    ),
    Command(
        "environments",
        "prune",
        "reclaim unused setup caches (dry run by default)",
        c.cmd_environments_prune,
        (
            APPLY,
            arg("--all", action="store_true", help="every cache entry and built environment image"),
            JSON,
        ),
    ),
    Command("workers", "list", "the workers and whether they can run", c.cmd_workers_list, (JSON,)),
    Command(
        "workers",
        "link",
        "register a command-line agent as a worker",
        c.cmd_workers_link,
        (
            arg("name"),
            arg("--command-json", required=True, help='e.g. \'["my-agent","run","{prompt}"]\''),
            arg("--image", help="image to run it in (default: the base image)"),
            arg(
                "--route",
                action="append",
                default=[],
                metavar="NAME",
                help="a gateway model route it uses (repeatable), e.g. anthropic",
            ),
        ),
    ),
    Command(
        "images",
        "build",
        "build base, verify and worker images",
        c.cmd_images_build,
        (
            arg("names", nargs="*", metavar="NAME", help="base, verify or a worker name"),
            arg("--base-image", help="BASE_IMAGE for the base image (a local ref works)"),
            arg(
                "--all",
                action="store_true",
                help="every image: base, verify, mock and each worker CLI",
            ),
            arg(
                "--smoke",
                action="store_true",
                help="then run one task in each worker image built (each CLI against a scripted "
                "model)",
            ),
        ),
    ),
    Command("doctor", None, "check that tasks can run here", c.cmd_doctor, (JSON,)),
    Command("ui", None, "serve the local web view (tasks, jobs, diffs, accept)", cmd_ui, acts=True),
    Command("mcp", None, "run the MCP server (stdio, or streamable HTTP with --http)", c.cmd_mcp),
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="worker-bridge", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="group", required=True, parser_class=_Parser)
    groups: dict[str, Any] = {}
    for command in COMMANDS:
        if command.name is None:
            p = sub.add_parser(command.group, help=command.help)
        else:
            if command.group not in groups:
                group = sub.add_parser(command.group, help=GROUPS[command.group])
                groups[command.group] = group.add_subparsers(
                    dest="command", required=True, parser_class=_Parser
                )
            p = groups[command.group].add_parser(command.name, help=command.help)
        for argument in command.args:
            p.add_argument(*argument.flags, **argument.options)
        if command.group == "mcp":
            add_mcp_transport_arguments(p)
        if command.group == "ui":
            add_ui_arguments(p)
        p.set_defaults(func=command.run, acts=command.acts)
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
            bridge.check_state_root()  # in a container: shared with the host?
        if args.acts:  # a command that acts first resolves tasks whose runner died
            args.recovered = bridge.recover()
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
