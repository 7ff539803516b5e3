"""Serving an ASGI app with uvicorn within the listener's bounds (config `http`,
bridge/listener/limits.py) until SIGINT/SIGTERM, and the recovery loop of a long-lived server
(the MCP server, `worker-bridge ui`): tasks whose runner died are handed to new runners at start
and every 30 s, so reads never start a process."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from bridge.config.settings import HttpConfig
from bridge.errors import BridgeError
from bridge.host.heap import freeze_start_up_heap
from bridge.listener.limits import (
    ASGIApp,
    uvicorn_options,
)
from bridge.listener.options import HttpOptions

log = logging.getLogger("worker_bridge.mcp.http")

SHUTDOWN_GRACE_S = 5
RECOVERY_SECONDS = 30.0  # how often a long-lived server hands stranded tasks to new runners


def run_listener(app: ASGIApp, options: HttpOptions, limits: HttpConfig) -> int:
    """Serve ``app`` with uvicorn on the options' address within the listener's bounds until
    SIGINT/SIGTERM (the MCP listener and `worker-bridge ui` alike)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_config=None,  # uvicorn's loggers propagate to ours: stderr and logs/mcp-server.log
        access_log=False,  # refusals are logged by the gate; polling would flood the log
        server_header=False,
        proxy_headers=False,  # the peer logged is the real one, not an X-Forwarded-For
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        **uvicorn_options(limits),
    )
    freeze_start_up_heap()
    uvicorn.Server(config).run()
    return 0


def keep_recovering(recover: Callable[[], Any], every_s: float = RECOVERY_SECONDS) -> None:
    """For a long-lived server (the MCP server, `worker-bridge ui`): hand tasks whose runner
    died to new runners now and every ``every_s``, in a daemon thread of its own, so that
    reading (status, logs, the pages) never has to start a process."""

    stop = threading.Event()  # never set: the thread ends with the process

    def recover_now() -> None:
        try:
            recover()
        except BridgeError as exc:
            log.warning("recovery skipped: %s", exc.message)
        except Exception:  # noqa: BLE001 - the server outlives a failed round
            log.exception("recovery failed")

    def loop() -> None:
        while not stop.wait(every_s):
            recover_now()

    recover_now()
    threading.Thread(target=loop, name="recovery", daemon=True).start()
