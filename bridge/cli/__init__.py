"""The `worker-bridge` command: a thin layer over WorkerBridge.

Exit codes: 0 success; 1 the task failed or was refused; 2 usage, configuration or invalid spec.
With --json, stdout carries exactly one JSON document.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading
from typing import NoReturn

from bridge.cli.gate import turn
from bridge.cli.render import SafeStream
from bridge.cli.table import COMMANDS, GROUPS
from bridge.cli.ui import add_arguments as add_ui_arguments
from bridge.errors import BridgeError
from bridge.listener.flags import add_arguments as add_mcp_transport_arguments

__all__ = ["COMMANDS", "build_parser", "finish", "main", "run"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(2, f"worker-bridge: {message} (see `{self.prog} --help`)\n")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. Given the ``argv`` it is for, only the group that argv names gets its
    commands and their arguments: that is all parsing it (or its `--help`) needs, since the
    top-level `--help` lists the groups alone, and adding every command's parser is most of a
    `--help`'s own time."""
    only = None if argv is None else (argv[0] if argv else "")
    parser = _Parser(prog="worker-bridge", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="group", required=True, parser_class=_Parser)
    groups: dict[str, argparse._SubParsersAction[_Parser] | None] = {}
    for command in COMMANDS:
        detailed = only is None or command.group == only
        if command.name is None:
            p = sub.add_parser(command.group, help=command.help)
        else:
            if command.group not in groups:
                group = sub.add_parser(command.group, help=GROUPS[command.group])
                groups[command.group] = (
                    group.add_subparsers(dest="command", required=True, parser_class=_Parser)
                    if detailed
                    else None
                )
            subcommands = groups[command.group]
            if subcommands is None:  # a group other than the one argv names
                continue
            p = subcommands.add_parser(command.name, help=command.help)
        if not detailed:
            continue
        for argument in command.args:
            p.add_argument(*argument.flags, **argument.options)
        if command.group == "mcp":
            add_mcp_transport_arguments(p)
        if command.group == "ui":
            add_ui_arguments(p)
        p.set_defaults(command_entry=command, acts=command.acts)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    streams = sys.stdout, sys.stderr
    if args.group != "mcp":  # the MCP server's stdout carries the protocol, not text for people
        sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr)
    bridge = None
    try:
        with turn():  # one command per CPU starts at a time (bridge/cli/gate.py)
            run = args.command_entry.function()
            from bridge.service import WorkerBridge

            bridge = WorkerBridge()
            if args.group in ("tasks", "workspaces", "jobs"):
                bridge.check_state_root()  # in a container: shared with the host?
            if args.acts:  # a command that acts first resolves tasks whose runner died
                args.recovered = bridge.recover()
        return run(bridge, args)
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


def run() -> None:
    """The console script's command run in this process (and `python -m bridge.cli`): main(),
    then `finish`. An exit by exception (SystemExit from argparse, a crash) takes the ordinary
    way."""
    # The CLI uses no pydantic plugin, and looking for one (at the first model) reads every
    # installed distribution's metadata: ~15 ms of each command's start.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    finish(main())


def finish(code: int, signum: int | None = None) -> NoReturn:
    """End the process the way an interpreter's exit would, minus tearing down every module's
    objects, which costs a task's command ~40 ms of CPU and nothing of ours needs: threads are
    waited for as at exit (`threading._shutdown`), exit handlers run (the pool's among them),
    the standard streams are flushed, and no file of ours is left open past its `with`. With
    ``signum``, the process then dies of that signal (an uncaught KeyboardInterrupt's SIGINT)."""
    threading._shutdown()  # type: ignore[attr-defined]  # what exit runs first: idle
    # executors' workers told to stop, then every thread that is not a daemon joined
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what normal exit would also lose
            code = code or 1
    if signum is not None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(code)
