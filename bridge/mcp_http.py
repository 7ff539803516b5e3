"""MCP over streamable HTTP (`worker-bridge-mcp --http HOST:PORT`): the SDK's streamable HTTP app
behind a bearer-token gate, served with uvicorn.

The tools are the stdio server's (bridge/mcp_server.py builds them); this module only adds what a
network listener needs. Every request must carry `Authorization: Bearer <token>` except
`GET /healthz`, which the container healthcheck calls, and the web view under `/ui`
(bridge/ui), which takes the same token once and gives the browser a session cookie. Tokens are
compared in constant time and never logged; a refusal is logged with the client, the path and
why (missing, malformed, wrong).

The token comes from `--token-file PATH`, else `$WORKER_BRIDGE_MCP_TOKEN_FILE` (a compose secret),
else `$WORKER_BRIDGE_MCP_TOKEN`; it is removed from the environment once read, so the task
runners and tools this server starts do not inherit it. Without a token the server refuses to
start, unless it is bound to a loopback address and given `--no-token`.

Below the gate, bridge/mcp_http_limits.py bounds what any client may hold (config `http`):
deadlines for a request's head and body, connection caps per client address and in total, a
request body read whole and bounded before the SDK sees it, and the SDK's session cap and idle
reaping. A request refused for its token gets its 401 and the connection closed, so without the
token a client never holds more than one head, for no longer than the head deadline.

The SDK app comes from the server object; of `mcp` itself only the DNS-rebinding settings are
imported here (the tools live in mcp_tools.py, the server in mcp_server.py).
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import logging
import os
import re
import stat
import threading
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.config import HttpConfig
from bridge.errors import BridgeError, ConfigError
from bridge.heap import freeze_start_up_heap
from bridge.mcp_flags import HEALTH_PATH, MCP_PATH, TOKEN_ENV, TOKEN_FILE_ENV
from bridge.mcp_http_limits import (
    ASGIApp,
    Receive,
    RefusalLog,
    Scope,
    Send,
    SessionCapNotice,
    WholeBody,
    describe_bounds,
    uvicorn_options,
)
from bridge.version import __version__

log = logging.getLogger("worker_bridge.mcp.http")

SHUTDOWN_GRACE_S = 5
RECOVERY_SECONDS = 30.0  # how often a long-lived server hands stranded tasks to new runners
MIN_TOKEN_CHARS = 16

_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
_TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")  # what fits in a header value unquoted
_GIVE_TOKEN = (
    f"give a bearer token with --token-file PATH, ${TOKEN_FILE_ENV} or ${TOKEN_ENV} "
    "(e.g. from `openssl rand -hex 32`)"
)
_HOW_TO_GIVE = f"{_GIVE_TOKEN}, or pass --no-token on a loopback address"


@dataclass(frozen=True)
class HttpOptions:
    host: str
    port: int
    token: str | None = field(repr=False)  # never in a repr, so never in a log line
    token_source: str
    warnings: tuple[str, ...] = ()


def resolve_options(
    args: argparse.Namespace, env: MutableMapping[str, str] = os.environ
) -> HttpOptions | None:
    """The validated HTTP settings, or None for stdio. Raises ConfigError (exit 2) with one
    sentence for a bad address, an unusable token file, or a missing token."""
    bind = getattr(args, "http", None)
    token_file = getattr(args, "token_file", None)
    no_token = bool(getattr(args, "no_token", False))
    if bind is None:
        if token_file or no_token:
            raise ConfigError("--token-file and --no-token apply only with --http HOST:PORT.")
        return None
    host, port = parse_bind(bind)
    env_token = env.pop(TOKEN_ENV, None)  # read once; child processes must not inherit it
    file_path = token_file or env.get(TOKEN_FILE_ENV) or None
    if no_token:
        if file_path or env_token is not None:
            raise ConfigError(
                "--no-token was given but so was a token; drop one of them "
                f"(--token-file, ${TOKEN_FILE_ENV}, ${TOKEN_ENV})."
            )
        if not is_loopback(host):
            raise ConfigError(
                f"--no-token is allowed only on a loopback address (127.0.0.1, ::1, localhost), "
                f"not {host}; {_GIVE_TOKEN}."
            )
        return HttpOptions(host, port, None, "none (--no-token)")
    if file_path:
        source = "--token-file" if token_file else f"${TOKEN_FILE_ENV}"
        token, warnings = read_token_file(Path(file_path), source)
        return HttpOptions(host, port, _long_enough(token, host), f"{source} {file_path}", warnings)
    if env_token is not None:
        token = env_token.strip()
        if not token:
            raise ConfigError(f"${TOKEN_ENV} is set but empty; {_HOW_TO_GIVE}.")
        token = _long_enough(check_token(token, f"${TOKEN_ENV}"), host)
        return HttpOptions(host, port, token, f"${TOKEN_ENV}")
    raise ConfigError(f"--http needs a bearer token: {_HOW_TO_GIVE}.")


def _long_enough(token: str, host: str) -> str:
    """Off loopback a short token can be guessed over the network: refused there (a warning
    on loopback)."""
    if len(token) < MIN_TOKEN_CHARS and not is_loopback(host):
        raise ConfigError(
            f"The bearer token has {len(token)} characters; off loopback it needs at least "
            f"{MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 32`)."
        )
    return token


def parse_bind(text: str, flag: str = "--http") -> tuple[str, int]:
    """`HOST:PORT` with HOST an IP address ([::1] for IPv6) or a hostname, PORT 1-65535."""
    usage = f"{flag} wants HOST:PORT such as 127.0.0.1:8765 or 0.0.0.0:8765, not {text!r}."
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(usage)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not _is_ip(host) or ":" not in host:
            raise ConfigError(usage)
    elif not (_is_ip(host) and ":" not in host) and not _HOSTNAME.match(host):
        raise ConfigError(usage)  # a bare IPv6 address needs brackets: [::1]:8765
    return host, int(port_text)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# The Host names a loopback listener answers (DNS rebinding: a page whose own name resolves to
# 127.0.0.1 must get nothing), for the MCP path's guard and the web view's Host policy alike.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def url_host(host: str) -> str:
    """A host as it is written in a URL or a Host header: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def token_matches(presented: bytes, token: bytes | None) -> bool:
    """The one comparison of a presented token with the server's (constant time); any
    presented value matches when the server has none (`--no-token`)."""
    return token is None or hmac.compare_digest(presented.strip(), token)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    return _is_ip(host) and ipaddress.ip_address(host).is_loopback


def read_token_file(path: Path, source: str) -> tuple[str, tuple[str, ...]]:
    """The token in a one-line file. Missing, unreadable or empty is an error; a file others can
    read is a warning (compose secrets are often mounted 0444), not a refusal."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8") if stat.S_ISREG(mode) else None
    except FileNotFoundError:
        raise ConfigError(f"The token file {path} ({source}) does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"The token file {path} ({source}) cannot be read: {exc}.") from None
    if text is None:
        raise ConfigError(f"The token file {path} ({source}) is not a regular file.")
    token = text.strip()
    if not token:
        raise ConfigError(f"The token file {path} ({source}) is empty; write the token into it.")
    warnings = []
    if mode & 0o077:
        warnings.append(
            f"the token file {path} is readable by group or others (mode "
            f"{stat.S_IMODE(mode):04o}); `chmod 600 {path}` keeps it to its owner"
        )
    return check_token(token, f"the token file {path}"), tuple(warnings)


def check_token(token: str, where: str) -> str:
    if not _TOKEN_CHARS.match(token):
        raise ConfigError(
            f"The token in {where} must be one word of printable ASCII (no spaces or line "
            "breaks), as it travels in an HTTP header."
        )
    return token


class BearerGate:
    """ASGI wrapper around the SDK app: answers GET /healthz itself and lets anything else
    through only with the right bearer token. Lifespan events pass straight through, so the
    SDK's session manager starts and stops with the server."""

    def __init__(self, app: ASGIApp, token: str | None, ui: ASGIApp | None = None) -> None:
        self.app = app
        self.ui = ui  # the web view (bridge/ui) under /ui: it signs in with the same token
        self._token = token.encode() if token is not None else None
        self._health = json.dumps({"ok": True, "version": __version__}).encode()
        self._refusals = RefusalLog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            return await self.app(scope, receive, send)
        if kind == "http" and scope["path"] == HEALTH_PATH and scope["method"] == "GET":
            return await _respond(send, 200, self._health)
        if self.ui is not None and kind == "http" and _is_ui(scope["path"]):
            return await self.ui(scope, receive, send)
        refusal = self._refusal(scope)
        if refusal is None:
            return await self.app(scope, receive, send)
        client = scope.get("client")
        who = f"{client[0]}:{client[1]}" if client else "an unknown client"
        method = scope.get("method", kind.upper())
        if self._refusals.may_log(f"{client[0] if client else ''} ({refusal})"):
            path = _printable(str(scope.get("path", "")))
            log.warning("refused %s %s from %s: %s", _printable(method), path, who, refusal)
        if kind != "http":  # a websocket: nothing is served there, close before accepting
            return await send({"type": "websocket.close", "code": 1008})
        challenge = 'Bearer realm="worker-bridge"'
        if not refusal.startswith("missing"):
            challenge += ', error="invalid_token"'
        body = {
            "error": "unauthorized",
            "message": "send the header 'Authorization: Bearer <token>' with the token this "
            "server was started with",
        }
        # Closed after the answer: without the token a connection holds one head, never more.
        refused = [(b"www-authenticate", challenge), (b"connection", "close")]
        await _respond(send, 401, json.dumps(body).encode(), refused)

    def _refusal(self, scope: Scope) -> str | None:
        """Why the request is refused (words for the log, never the token), or None."""
        if self._token is None:
            return None
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if header is None:
            return "missing bearer token"
        scheme, _, presented = header.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not presented.strip():
            return "malformed Authorization header (not 'Bearer <token>')"
        if not token_matches(presented, self._token):
            return "wrong bearer token"
        return None


def _is_ui(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


def _printable(text: str, limit: int = 200) -> str:
    """What a client sent, fit for a log line: escapes for anything outside printable ASCII
    (no forged lines, no terminal escapes), and bounded."""
    shown = text.encode("ascii", "backslashreplace").decode("ascii")
    shown = "".join(c if 32 <= ord(c) < 127 else f"\\x{ord(c):02x}" for c in shown)
    return shown if len(shown) <= limit else shown[:limit] + f"...[{len(shown) - limit} more]"


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, str]] | None = None
) -> None:
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(name, value.encode()) for name, value in headers or []]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


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
