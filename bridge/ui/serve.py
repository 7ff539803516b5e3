"""`worker-bridge ui`: the web view alone on its own listener (loopback by default), with the
MCP HTTP listener's token handling (bridge/listener/options.py: `--token-file`, the same environment
variables, `--no-token` only on loopback), its connection bounds and its periodic recovery of
tasks whose runner died. It prints a sign-in link to the terminal whose fragment carries a
one-time code (a browser opened with it keeps it in its argv and history: the code makes one
session and is void after), never the token; given no token at all, it makes one for this run
and prints it apart, for the login form."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
from collections.abc import MutableMapping
from urllib.parse import quote

from bridge.config.settings import HttpConfig
from bridge.listener.flags import TOKEN_ENV, TOKEN_FILE_ENV
from bridge.listener.options import HttpOptions, http_options, parse_bind, url_host
from bridge.listener.run import keep_recovering, run_listener
from bridge.service import WorkerBridge

DEFAULT_LISTEN = "127.0.0.1:8770"
log = logging.getLogger("worker_bridge.ui")


def ui_options(args: argparse.Namespace, env: MutableMapping[str, str] = os.environ) -> HttpOptions:
    """The listener's address and token: as `worker-bridge-mcp --http` resolves them, or a
    token made for this run when none is given. ConfigError (exit 2) in one sentence."""
    listen = args.listen or DEFAULT_LISTEN
    parse_bind(listen, "--listen")
    if args.token_file or args.no_token or env.get(TOKEN_FILE_ENV) or env.get(TOKEN_ENV):
        return http_options(listen, args.token_file, bool(args.no_token), env)
    host, port = parse_bind(listen, "--listen")
    return HttpOptions(host, port, secrets.token_urlsafe(32), "made for this run")


def login_url(options: HttpOptions, *, code: str | None = None) -> str:
    """The login page's URL; with ``code``, a one-time sign-in code in its fragment
    (`#code=`), which the browser never sends, and the page's script posts and removes from
    the address bar. The token is never put in a URL."""
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::") else options.host
    base = f"http://{url_host(host)}:{options.port}/ui/login"
    return f"{base}#code={quote(code)}" if code is not None else base


def serve(bridge: WorkerBridge, options: HttpOptions, limits: HttpConfig | None = None) -> int:
    """Serve the web view until SIGINT/SIGTERM, handing tasks whose runner died to new runners
    now and then, as the MCP server does."""
    from bridge.ui.app import build_app
    from bridge.ui.security import CODE_TTL_S, Sessions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    limits = limits or HttpConfig()
    for warning in options.warnings:
        log.warning("%s", warning)
    sessions = Sessions(options.token, options.port)
    if options.token is None:
        lines = [f"open {login_url(options)} (no token: --no-token)"]
    else:
        once = f"open {login_url(options, code=sessions.issue_code())} (it signs in once, "
        lines = [once + f"within {CODE_TTL_S // 60} minutes)"]
        if options.token_source == "made for this run":
            lines.append(
                f"to sign in again, the token made for this run (in no URL): {options.token}"
            )
        else:
            lines.append(f"to sign in again, the token from {options.token_source}")
    for line in lines:
        print(f"worker-bridge ui: {line}", file=sys.stderr, flush=True)
    keep_recovering(bridge.recover)
    app = build_app(bridge, sessions, host=options.host)
    return run_listener(app, options, limits)
