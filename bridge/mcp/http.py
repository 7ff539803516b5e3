"""MCP over streamable HTTP (`worker-bridge-mcp --http HOST:PORT`): the SDK's streamable HTTP app,
bounded (bridge/listener/limits.py) and behind the bearer-token gate (bridge/listener/gate.py),
served by the listener (bridge/listener/run.py), with the web view beside it under `/ui` when
asked. On a loopback address only requests naming a loopback host are served (DNS rebinding)."""

from __future__ import annotations

import logging
from typing import Any

from bridge.config.settings import HttpConfig
from bridge.listener.flags import HEALTH_PATH, MCP_PATH
from bridge.listener.gate import BearerGate
from bridge.listener.limits import (
    ASGIApp,
    SessionCapNotice,
    WholeBody,
    describe_bounds,
)
from bridge.listener.options import (
    LOOPBACK_NAMES,
    MIN_TOKEN_CHARS,
    HttpOptions,
    is_loopback,
    url_host,
)
from bridge.listener.run import run_listener

log = logging.getLogger("worker_bridge.mcp.http")


def _rebinding_guard(host: str) -> Any:
    """On a loopback address, only requests naming a loopback host (and coming from no foreign
    web origin) are served: a web page whose name rebinds to 127.0.0.x must not drive the
    bridge, with or without a token. (The SDK does this itself only for three spellings.)"""
    from mcp.server.transport_security import TransportSecuritySettings

    if not is_loopback(host):
        return None  # reached by name from elsewhere: the token is the protection
    hosts = [f"{url_host(name)}:*" for name in dict.fromkeys((host, *LOOPBACK_NAMES))]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts],
    )


def serve(
    server: Any, options: HttpOptions, limits: HttpConfig | None = None, ui: ASGIApp | None = None
) -> int:
    """Serve the MCP server object (the SDK's MCPServer) until SIGINT/SIGTERM, within the
    listener's bounds (config `http`); with ``ui``, the web view beside it under /ui."""
    limits = limits or HttpConfig()
    for warning in options.warnings:
        log.warning("%s", warning)
    if options.token is None:
        log.warning("serving WITHOUT a bearer token (--no-token): any local process can use it")
    elif len(options.token) < MIN_TOKEN_CHARS:
        log.warning("the bearer token is short; use at least %d random characters", MIN_TOKEN_CHARS)
    app = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        host=options.host,
        transport_security=_rebinding_guard(options.host),
        max_request_body_size=limits.max_body_kb * 1024,
        max_sessions=limits.max_sessions,
        session_idle_timeout=limits.session_idle_timeout_s,
    )
    log.info(
        "serving MCP over streamable HTTP at http://%s:%d%s (health: %s), token from %s",
        url_host(options.host),
        options.port,
        MCP_PATH,
        HEALTH_PATH,
        options.token_source,
    )
    log.info("listener bounds (config http): %s", describe_bounds(limits))
    gate = BearerGate(WholeBody(SessionCapNotice(app, limits), limits), options.token, ui)
    return run_listener(gate, options, limits)
