"""The CLI's commands as data: each command's group, name, help, arguments, the function that
runs it (named, imported only when it runs) and whether it acts. bridge/cli/__init__.py builds
the parser from this table."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arg:
    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclass(frozen=True)
class Command:
    """One CLI command: where it is (`group name`, or a group of its own), its arguments, the
    function that runs it (`module.function` in bridge/cli, imported only when the command
    runs, so that `--help` and a parse error load nothing but this module), and whether it acts
    (only a command that acts hands tasks whose runner died to new runners; one that reads
    starts nothing)."""

    group: str
    name: str | None
    help: str
    run: str
    args: tuple[Arg, ...] = ()
    acts: bool = False

    def function(self) -> Callable[..., int]:
        return _named(self.run)


def _named(where: str) -> Callable[..., Any]:
    module, name = where.split(".")
    return getattr(importlib.import_module(f"bridge.cli.{module}"), name)


JSON = arg("--json", action="store_true", help="print JSON (one document on stdout)")
TASK_ID = arg("task_id")
TASK_FLAGS = (
    arg("--objective", help="what the worker should do"),
    arg("--repo", help="path to the git repository (made absolute)"),
    arg("--worker", help="worker name (`workers list`)"),
    arg("--verify", action="append", metavar="CMD", help="verify command (repeatable)"),
    arg("--protect", action="append", metavar="GLOB", help="protected path pattern (repeatable)"),
    arg(
        "--type",
        metavar="T",
        help="task type (chore, feature, hotfix, refactor, or one config `profiles` adds): its "
        "profile fills what the other flags and the spec leave unset",
    ),
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
    "workers": "list, link and reset workers",
    "images": "build the worker-bridge images",
    "jobs": "several tasks together: compete, review, fanout and integrate",
    "cluster": "the cluster's nodes, as this control host sees them",
    "node": "this machine as a node of a cluster: join it, leave it",
}
JOB_ID = arg("job_id")
WAIT_JOB = arg("--wait", action="store_true", help="wait for the job, showing each task")
FANOUT_FLAGS = tuple(
    arg("--objective", action="append", metavar="TEXT", help="an objective (repeat, one per task)")
    if a.flags == ("--objective",)
    else a
    for a in TASK_FLAGS
)

# Every command: adding one is an entry here and its function in commands.py (tasks), jobs.py
# or admin.py (the host: workspaces, environments, workers, images, doctor, mcp), cluster.py
# (the cluster and this machine as its node), or ui.py.
COMMANDS = (
    Command(
        "tasks",
        "create",
        "validate and record a task; prints its id",
        "commands.cmd_tasks_create",
        TASK_FLAGS,
        acts=True,
    ),
    Command(
        "tasks",
        "run",
        "create a task and run it to the end",
        "commands.cmd_tasks_run",
        TASK_FLAGS,
        acts=True,
    ),
    Command(
        "tasks",
        "start",
        "start a created task",
        "commands.cmd_tasks_start",
        (
            TASK_ID,
            arg("--wait", action="store_true", help="run in this process until it ends"),
            JSON,
        ),
        acts=True,
    ),
    Command(
        "tasks",
        "show",
        "show a task result",
        "commands.cmd_tasks_show",
        (TASK_ID, JSON),
    ),
    Command(
        "tasks",
        "list",
        "list tasks, newest first",
        "commands.cmd_tasks_list",
        (arg("--status"), arg("--limit", type=int), JSON),
    ),
    Command(
        "tasks",
        "logs",
        "a task's events",
        "commands.cmd_tasks_logs",
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
        "commands.cmd_tasks_accept",
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
        "commands.cmd_tasks_follow_up",
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
        "answer",
        "answer a request of a task waiting for input (or of a running one's network)",
        "commands.cmd_tasks_answer",
        (
            TASK_ID,
            arg("request_id", help="the request's id (tasks show lists them)"),
            arg("--approve", action="store_true", help="allow the name or the paths asked for"),
            arg("--deny", action="store_true", help="refuse it (a question: decline to answer)"),
            arg("--text", default=None, help="a question's answer (one of its choices, or text)"),
            JSON,
        ),
        acts=True,
    ),
    Command(
        "tasks",
        "reject",
        "reject a succeeded task's change",
        "commands.cmd_tasks_reject",
        (TASK_ID, arg("--reason", default="", help="why (recorded with the task)"), JSON),
        acts=True,
    ),
    Command(
        "tasks",
        "cancel",
        "cancel a task and kill its containers",
        "commands.cmd_tasks_cancel",
        (TASK_ID, JSON),
        acts=True,
    ),
    Command(
        "tasks",
        "recover",
        "hand tasks whose runner died to new runners (every command that acts does this first)",
        "commands.cmd_tasks_recover",
        (JSON,),
        acts=True,
    ),
    Command(
        "tasks",
        "retry",
        "a new task from a finished task's spec (linked to it), started in the background",
        "jobs.cmd_tasks_retry",
        (TASK_ID, JSON),
        acts=True,
    ),
    Command(
        "jobs",
        "compete",
        "one objective on several workers; candidates ranked by our verification",
        "jobs.cmd_jobs_compete",
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
        "jobs.cmd_jobs_review",
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
        "jobs.cmd_jobs_fanout",
        (*FANOUT_FLAGS, WAIT_JOB),
        acts=True,
    ),
    Command(
        "jobs",
        "integrate",
        "apply a job's chosen verified tasks one after another, verifying after each",
        "jobs.cmd_jobs_integrate",
        (
            JOB_ID,
            arg("--tasks", required=True, metavar="A,B", help="tasks, in order"),
            WAIT_JOB,
            JSON,
        ),
        acts=True,
    ),
    Command("jobs", "show", "show a job result", "jobs.cmd_jobs_show", (JOB_ID, JSON)),
    Command(
        "jobs",
        "list",
        "list jobs, newest first",
        "jobs.cmd_jobs_list",
        (arg("--limit", type=int), JSON),
    ),
    Command(
        "jobs",
        "cancel",
        "cancel a job and every task of it",
        "jobs.cmd_jobs_cancel",
        (JOB_ID, JSON),
        acts=True,
    ),
    Command(
        "jobs",
        "accept",
        "accept a job's best candidate (or --task) and reject the others",
        "jobs.cmd_jobs_accept",
        (JOB_ID, arg("--task", metavar="TASK_ID", help="the candidate to accept"), JSON),
        acts=True,
    ),
    Command(
        "workspaces",
        "prune",
        "reclaim what finished tasks left (dry run by default)",
        "admin.cmd_workspaces_prune",
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
        "admin.cmd_environments_list",
        (JSON,),
    ),
    Command(
        "environments",
        "prune",
        "reclaim unused setup caches (dry run by default)",
        "admin.cmd_environments_prune",
        (
            APPLY,
            arg("--all", action="store_true", help="every cache entry and built environment image"),
            JSON,
        ),
    ),
    Command(
        "workers",
        "list",
        "the workers and whether they can run",
        "admin.cmd_workers_list",
        (JSON,),
    ),
    Command(
        "workers",
        "reset",
        "close a worker's circuit breaker, so new tasks for it are taken again",
        "admin.cmd_workers_reset",
        (arg("name"), JSON),
    ),
    Command(
        "workers",
        "link",
        "register a command-line agent as a worker",
        "admin.cmd_workers_link",
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
        "admin.cmd_images_build",
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
    Command(
        "cluster",
        "status",
        "each node: address, alive, slots in use, images",
        "cluster.cmd_cluster_status",
        (JSON,),
    ),
    Command(
        "node",
        "start",
        "join this machine to a Ray cluster as a node (`ray start`, detached)",
        "cluster.cmd_node_start",
        (
            arg("--address", required=True, metavar="HOST:PORT", help="the Ray head's address"),
            arg(
                "--slots", type=int, metavar="N", help="tasks at once (default: min(cores, GiB/4))"
            ),
            arg("--docker-host", metavar="URL", help="the engine its tasks use (DOCKER_HOST)"),
            arg("--name", help="the node's name (default: from the hostname)"),
            arg("--root", metavar="PATH", help="the agent's folder (WORKER_BRIDGE_NODE_HOME)"),
            arg(
                "--insecure-no-token",
                action="store_true",
                help="join even though RAY_AUTH_MODE is not `token`",
            ),
        ),
    ),
    Command(
        "node",
        "stop",
        "stop the Ray node `node start` started (by its recorded pid)",
        "cluster.cmd_node_stop",
        (
            arg("--name", help="the name it was started with (default: from the hostname)"),
            arg("--root", metavar="PATH", help="the --root it was started with"),
        ),
    ),
    Command("doctor", None, "check that tasks can run here", "admin.cmd_doctor", (JSON,)),
    Command(
        "ui", None, "serve the local web view (tasks, jobs, diffs, accept)", "ui.cmd_ui", acts=True
    ),
    Command(
        "mcp",
        None,
        "run the MCP server (stdio, or streamable HTTP with --http)",
        "admin.cmd_mcp",
    ),
)
