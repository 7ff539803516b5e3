"""The MCP server (`worker-bridge-mcp`, also `worker-bridge mcp`): the contract's tools
(bridge/mcp/tools.py) over the same WorkerBridge facade as the CLI, on stdio or (with --http,
see bridge/mcp/http.py) over streamable HTTP. The `mcp` SDK is imported only in this package.
stdout carries protocol messages only; logs go to stderr and a rotated file. Tasks whose runner
died are handed to new runners at start and every 30 s (bridge/listener/run.py:
`keep_recovering`).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import logging.handlers
import sys

from bridge.errors import BridgeError
from bridge.host.heap import freeze_start_up_heap
from bridge.listener import flags, options
from bridge.listener.run import keep_recovering
from bridge.mcp.calls import BridgeCalls
from bridge.mcp.job_tools import JobTools
from bridge.mcp.resources import TaskResources
from bridge.mcp.tasks import BridgeTasks, TasksServer
from bridge.mcp.tools import TOOLS, TaskTools
from bridge.service import WorkerBridge
from bridge.version import __version__

log = logging.getLogger("worker_bridge.mcp")


INSTRUCTIONS = """\
worker-bridge delegates a scoped coding task to another coding agent (a "worker") that runs in a
disposable, network-less container on a git worktree of a repository. When the worker finishes,
worker-bridge re-runs your verify commands itself in a clean container and keeps the diff. Nothing
changes in the repository until you call worker_accept.

Typical flow: worker_delegate (returns a task_id at once) -> keep working -> poll worker_status
with the task_id until status is succeeded/failed/... -> read changed_files and
artifacts.diff -> worker_accept to write the verified change into the working tree, or
worker_follow_up to ask for more changes on the same worktree. A task in status waiting_input
has a pending entry in `requests` (a network name, protected paths or a question of its worker):
answer it with worker_answer, and the worker carries on in its own session.
"""


def build_server(bridge: WorkerBridge | None = None) -> TasksServer:
    call = BridgeCalls(bridge or WorkerBridge())
    tools = (TaskTools(call), JobTools(call))
    tasks = BridgeTasks(call)
    server = TasksServer(
        "worker-bridge",
        version=__version__,
        instructions=INSTRUCTIONS,
        extensions=[tasks],
        middleware=[tasks.middleware],
    )
    for name, hints in TOOLS.items():
        method = next(getattr(t, name) for t in tools if hasattr(t, name))
        server.add_tool(
            method, name=name, description=inspect.cleandoc(method.__doc__ or ""), annotations=hints
        )
    TaskResources(call).register(server)
    return server


def _setup_logging(bridge: WorkerBridge) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    try:
        logs = bridge.config.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        # Rotated: a long-lived HTTP server must not grow its log without bound.
        handlers.append(
            logging.handlers.RotatingFileHandler(
                logs / "mcp-server.log", maxBytes=10 * 2**20, backupCount=3
            )
        )
    except OSError:
        pass
    logging.basicConfig(
        level=logging.INFO,
        handlers=handlers,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="worker-bridge-mcp",
        description="Serve worker-bridge's MCP tools on stdio, or streamable HTTP with --http.",
    )
    flags.add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace, bridge: WorkerBridge | None = None) -> int:
    """Serve on stdio, or on HTTP when args.http is set (also `worker-bridge mcp`). Bad transport
    flags or a missing token are refused before anything starts."""
    try:
        http = options.resolve_options(args)
        bridge = bridge or WorkerBridge()
        bridge.check_state_root()  # in a container: shared with the host?
        bridge.private_home()  # before its log is written there
    except BridgeError as exc:
        print(f"worker-bridge-mcp: {exc.message}", file=sys.stderr)
        return exc.exit_code
    _setup_logging(bridge)
    log.info("worker-bridge MCP server %s, state root %s", __version__, bridge.config.home)
    keep_recovering(bridge.recover)
    server = build_server(bridge)
    if http is not None:
        ui = None
        if bridge.config.http.ui:  # the web view under /ui, same token (config http.ui)
            from bridge.ui.app import build_app
            from bridge.ui.security import Sessions

            ui = build_app(bridge, Sessions(http.token, http.port), host=http.host)
        from bridge.mcp.http import serve

        return serve(server, http, bridge.config.http, ui)
    freeze_start_up_heap()
    server.run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
