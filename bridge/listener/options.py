"""How a listener is reached: the address to bind (`HOST:PORT`), the bearer token and where it came
from (`--token-file`, `$WORKER_BRIDGE_MCP_TOKEN_FILE`, `$WORKER_BRIDGE_MCP_TOKEN`, or `--no-token`
on loopback), validated into `HttpOptions` with one sentence for anything wrong. The MCP server's
HTTP transport and `worker-bridge ui` both start from here. The token is removed from the
environment once read, so no child process inherits it; it is never in a repr or a log line."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from bridge.errors import ConfigError
from bridge.listener.flags import TOKEN_ENV, TOKEN_FILE_ENV

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
    return http_options(bind, token_file, no_token, env)


def http_options(
    bind: str, token_file: str | None, no_token: bool, env: MutableMapping[str, str]
) -> HttpOptions:
    """resolve_options for a listener that is given its ``bind`` address (`HOST:PORT`)."""
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
