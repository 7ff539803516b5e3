"""What the sandbox may reach: model routes by name (each with its upstream and how its key is
added), and, with `network.mode: allowlist`, listed host names on allowed ports, resolved on the
host to addresses that are neither loopback, private, link-local nor cloud metadata (unless a
range is trusted in config). Checked when the task is created (bad input is named) and again on
every connection (a name that resolves somewhere else later is refused then)."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bridge.config.settings import Config, RouteConfig
from bridge.errors import InvalidSpec
from bridge.gateway.paths import check_pattern
from bridge.models import TaskSpec

# What each built-in route lets through: the model calls its CLIs make (Claude Code: Messages,
# and counting tokens; Codex: Responses; OpenCode: Chat Completions), nothing else of the
# provider's API (files, batches, keys, organisation endpoints). See docs/network.md.
MESSAGES_PATHS = ["POST /v1/messages", "POST /v1/messages/count_tokens"]
OPENAI_PATHS = ["POST /v1/responses", "POST /v1/chat/completions"]

# The built-in model routes; config `gateway.routes` adds to or replaces them.
BUILTIN_ROUTES: dict[str, RouteConfig] = {
    "anthropic": RouteConfig(
        upstream="https://api.anthropic.com",
        auth="x-api-key",
        key_env="ANTHROPIC_API_KEY",
        paths=MESSAGES_PATHS,
    ),
    "openai": RouteConfig(
        upstream="https://api.openai.com",
        auth="bearer",
        key_env="OPENAI_API_KEY",
        paths=OPENAI_PATHS,
    ),
    # A Claude subscription: the long-lived token of `claude setup-token`, added on the host as
    # a bearer token; the sandbox's Claude Code holds only a placeholder (see docs/workers.md).
    "claude-subscription": RouteConfig(
        upstream="https://api.anthropic.com",
        auth="bearer",
        key_env="CLAUDE_CODE_OAUTH_TOKEN",
        paths=MESSAGES_PATHS,
    ),
    # Z.ai's Anthropic-compatible endpoint (what zcode-glm, Claude Code on GLM, speaks).
    "zai": RouteConfig(
        upstream="https://api.z.ai/api/anthropic",
        auth="bearer",
        key_env="ZCODE_AUTH_TOKEN",
        paths=MESSAGES_PATHS,
    ),
}

_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
# An exact name (one label is fine: `localhost`, a mirror's short name), or `*.` and a name of
# at least two labels (`*.com` would allow too much).
_NAME = re.compile(rf"^(?:\*\.{_LABEL}(?:\.{_LABEL})+|{_LABEL}(?:\.{_LABEL})*)$")
_EXACT = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")  # a name, never a pattern
# A last label a resolver reads as a number (decimal, octal or hex: `134744072`, `0x08080808`,
# `10.0x1`): the whole is an address in disguise, not a name.
_NUMERIC = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")
HOSTS_FILE = Path("/etc/hosts")
_ROUTE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
# Addresses that are never an egress target unless trusted: the cloud metadata services too.
_METADATA = [ipaddress.ip_network(n) for n in ("169.254.169.254/32", "fd00:ec2::254/128")]
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: private in practice


@dataclass(frozen=True)
class Route:
    name: str
    upstream: str
    auth: str
    key_env: str | None
    key: str | None  # the real credential, from the host's environment, never stored
    paths: tuple[str, ...] | None = None  # what it lets through (None: every path)

    def auth_header(self) -> tuple[str, str] | None:
        if not self.key:
            return None
        if self.auth == "bearer":
            return "authorization", f"Bearer {self.key}"
        if self.auth == "x-api-key":
            return "x-api-key", self.key
        return self.auth.removeprefix("header:").lower(), self.key


def all_routes(config: Config) -> dict[str, RouteConfig]:
    """The built-in routes with config's on top: for a built-in route, the keys config sets
    replace its own (``{anthropic: {key_env: MY_KEY}}`` changes only the variable); a built-in
    route given another upstream keeps nothing of its own (its key must not go there unless
    config names the variable again). A built-in route keeps its list of paths wherever it
    points, unless config gives one."""
    routes = dict(BUILTIN_ROUTES)
    for name, route in config.gateway.routes.items():
        base = routes.get(name)
        given = {k: v for k, v in route.model_dump().items() if v is not None}
        fresh = RouteConfig(auth="bearer", paths=base.paths if base else None)
        if base is not None and given.get("upstream", base.upstream) != base.upstream:
            base = None  # pointed elsewhere: the built-in key must not go along
        routes[name] = (base or fresh).model_copy(update=given)
    return routes


def check_routes(config: Config, names: list[str], env: Mapping[str, str] | None = None) -> None:
    """InvalidSpec naming an unknown route, a bad auth style or a missing credential."""
    env = os.environ if env is None else env
    known = all_routes(config)
    for name in names:
        if name not in known:
            raise InvalidSpec(
                f"Unknown gateway route '{name}'; known routes: {', '.join(sorted(known))} "
                "(add one under gateway.routes in config.yaml)."
            )
        route = known[name]
        if not route.upstream:
            raise InvalidSpec(f"gateway.routes.{name} needs an upstream (the provider's base URL).")
        if not _ROUTE_NAME.match(name):
            raise InvalidSpec(
                f"Gateway route name '{name}' must be lowercase letters, digits, - or _."
            )
        auth = route.auth or "bearer"
        if auth not in ("bearer", "x-api-key") and not auth.startswith("header:"):
            raise InvalidSpec(
                f"gateway.routes.{name}.auth '{route.auth}' must be bearer, x-api-key or "
                "header:<Name>."
            )
        for pattern in route.paths or []:
            why = check_pattern(pattern)
            if why is not None:
                raise InvalidSpec(f"gateway.routes.{name}.paths: {why}.")
        if route.key_env and not env.get(route.key_env):
            raise InvalidSpec(
                f"Gateway route '{name}' needs its key in the environment variable "
                f"{route.key_env}, which is not set; set it where worker-bridge runs."
            )


def resolve_routes(config: Config, names: list[str]) -> dict[str, Route]:
    known = all_routes(config)
    return {name: _route(name, known[name]) for name in names if name in known}


def _route(name: str, given: RouteConfig) -> Route:
    return Route(
        name,
        (given.upstream or "").rstrip("/"),
        given.auth or "bearer",
        given.key_env,
        os.environ.get(given.key_env or "") or None,
        tuple(given.paths) if given.paths is not None else None,
    )


def check_domains(domains: list[str]) -> list[str]:
    """The patterns normalised (lower case), or InvalidSpec naming the first bad one."""
    out = []
    for raw in domains:
        pattern = raw.strip().lower().rstrip(".")
        if not _NAME.match(pattern) or _numeric_end(pattern) or len(pattern) > 253:
            raise InvalidSpec(
                f"Invalid domain '{raw}' in network.domains; give a host name such as "
                "example.com or *.example.com (no scheme, port, path or address)."
            )
        out.append(pattern)
    return out


def _numeric_end(name: str) -> bool:
    return bool(_NUMERIC.match(name.rsplit(".", 1)[-1]))


def request_refusal(host: str, trusted: list, hosts_file: Path = HOSTS_FILE) -> str | None:
    """Why a refusal of ``host`` (off the task's list) may not become a request, as what it
    is ("an address (loopback)", "not a valid host name", "a name of a loopback address
    (/etc/hosts)"); None: it may. Nothing is resolved here (the host's DNS must not be the
    worker's channel out): an address literal of any form (dotted, decimal, octal, hex, IPv6),
    a `*` or anything but an exact name of at most 253 characters, and a name known to be
    local (``localhost``, ``*.local``, ``*.internal``..., or an /etc/hosts entry of a refused
    address class) are refused outright."""
    name = host.strip().lower().rstrip(".")
    literal = _literal(name)
    if literal is not None:
        why = address_refusal(literal, trusted) if _is_ip(literal) else None
        return f"an address{f' ({why})' if why else ''}, not a name"
    if ":" in name or _numeric_end(name):
        return "an address, not a name"
    if len(name) > 253 or not _EXACT.match(name):
        return "not a valid host name"
    if name in _LOCAL_NAMES or name.endswith(_LOCAL_SUFFIXES):
        return "a name of the local network"
    for address in _hosts_entries(hosts_file).get(name, []):
        why = address_refusal(address, trusted)
        if why is not None:
            return f"a name of {why} ({hosts_file})"
    return None


def _literal(name: str) -> str | None:
    try:
        return str(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        return None


def _is_ip(text: str) -> bool:
    return _literal(text) is not None


# Names that are local by definition or convention: never asked for (RFC 6761, 6762, 8375).
_LOCAL_NAMES = {"localhost", "ip6-localhost", "ip6-loopback", "metadata"}
_LOCAL_SUFFIXES = (".localhost", ".local", ".localdomain", ".internal", ".home.arpa")
_hosts_cache: dict[Path, tuple[tuple[int, int], dict[str, list[str]]]] = {}


def _hosts_entries(path: Path) -> dict[str, list[str]]:
    """name -> its addresses in ``path`` (the host's /etc/hosts), read again when it changes."""
    try:
        st = path.stat()
    except OSError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _hosts_cache.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    entries: dict[str, list[str]] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and _is_ip(fields[0].split("%", 1)[0]):
            for name in fields[1:]:
                entries.setdefault(name.lower().rstrip("."), []).append(fields[0].split("%")[0])
    _hosts_cache[path] = (stamp, entries)
    return entries


def check_ranges(ranges: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    try:
        return [ipaddress.ip_network(r, strict=False) for r in ranges]
    except ValueError as exc:
        raise InvalidSpec(f"Invalid gateway.trusted_ranges entry: {exc}.") from exc


def name_allowed(host: str, patterns: list[str]) -> bool:
    host = host.lower().rstrip(".")
    for pattern in patterns:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and host != pattern[2:]:
                return True
        elif host == pattern:
            return True
    return False


def address_refusal(address: str, trusted: list) -> str | None:
    """Why ``address`` is not an egress target (None: it may be reached)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 address carried inside (mapped, 6to4, Teredo) is judged as itself.
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            ip = embedded
    if any(ip in net for net in trusted):
        return None
    if ip.is_unspecified:
        return "not a public unicast address"
    if any(ip in net for net in _METADATA):
        return "a cloud metadata address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_private or (isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED):
        return "a private address"
    if ip.is_multicast or ip.is_reserved:
        return "not a public unicast address"
    return None


def hosts_addresses(name: str, hosts_file: Path = HOSTS_FILE) -> list[str]:
    """The addresses the host's /etc/hosts gives ``name`` (none: it is not there)."""
    return list(_hosts_entries(hosts_file).get(name.lower().rstrip("."), []))


async def resolve_approved(name: str, port: int, timeout: float) -> list[str]:
    """The addresses of an approved name, exactly that name: its /etc/hosts entry, else the
    absolute name (a trailing dot) in DNS, so the resolver's `search` list never turns `wiki`
    or a name that does not exist into one of the host's own network (`wiki.corp.example`)
    that nobody approved."""
    return hosts_addresses(name) or await resolve(name.rstrip(".") + ".", port, timeout)


async def resolve(host: str, port: int, timeout: float) -> list[str]:
    """The host's addresses, resolved here (the sandbox has no DNS), without holding up the
    gateway's other connections."""
    import asyncio  # here: the task's side imports this module, and only the gateway runs this

    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout
        )
    except (socket.gaierror, UnicodeError, TimeoutError):
        return []
    seen: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in seen:
            seen.append(address)
    return seen


def check_network(config: Config, spec: TaskSpec, routes: list[str]) -> None:
    """At task creation: the worker's routes exist and have their credentials, the allowlist's
    names are valid, the trusted ranges parse (InvalidSpec naming what is wrong)."""
    check_routes(config, routes)
    check_ranges(config.gateway.trusted_ranges)
    if spec.network.mode == "allowlist":
        if not spec.network.domains:
            raise InvalidSpec(
                "network.mode 'allowlist' needs network.domains (the names to reach)."
            )
        check_domains(spec.network.domains)
    elif spec.network.domains:
        raise InvalidSpec("network.domains is only used with network.mode 'allowlist'.")
