"""What a model route lets through: a request target in one plain spelling, and, when the route
has a list, only the methods and paths on it (the built-in routes list what their CLIs send, so
the host's key opens the model calls and not the provider's whole API).

A target is taken only when there is one way to read it, the way the gateway and any upstream
would both read it: no backslash, no `;` path parameter, no empty, `.` or `..` segment, and
percent escapes only for characters that mean nothing to a path (never `.`, `/`, `\\`, `;`, `%`
itself, so `%2e` and the double-encoded `%252e` are refused, nor a control character), decoding
to valid UTF-8 (no overlong forms). It is then forwarded exactly as sent."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Characters an escape may not stand for: they change how a path is read, or hide a control.
_SPECIAL = frozenset(b"./\\;%") | frozenset(range(0x20)) | {0x7F}
_ESCAPE = re.compile(rb"%(?:([0-9A-Fa-f]{2}))?")
_PATTERN = re.compile(r"^(\*|[A-Z]{3,10}) (/[A-Za-z0-9._~!$&'()+,=:@/-]*?)(/\*)?$")


class BadTarget(ValueError):
    """Why a request target is refused (one line, for the sandbox and the event)."""


@dataclass(frozen=True)
class Target:
    route: str  # the first segment: the route's name
    path: str  # the rest of the path, decoded, with its leading slash ("/v1/messages")
    raw_rest: bytes  # what follows the route's name, as sent (path and query), forwarded as is


def parse_target(raw: bytes) -> Target:
    """The route, path and forwarded remainder of an origin-form target, or BadTarget."""
    if not raw.startswith(b"/"):
        raise BadTarget("the request target must be a path starting with /")
    if any(byte <= 0x20 or byte >= 0x7F for byte in raw):
        raise BadTarget("the request target holds a character that is not printable ASCII")
    path, _, _query = raw.partition(b"?")
    if b"\\" in path:
        raise BadTarget("a backslash in the path")
    if b";" in path:
        raise BadTarget("a ; path parameter in the path")
    decoded = _decode(path)
    segments = decoded.split("/")[1:]
    if any(segment in ("", ".", "..") for segment in segments):
        raise BadTarget("an empty, . or .. segment in the path")
    route = segments[0]
    rest = raw[1 + len(path.split(b"/")[1]) :]
    return Target(route, "/" + "/".join(segments[1:]), rest)


def _decode(path: bytes) -> str:
    out = bytearray()
    position = 0
    for match in _ESCAPE.finditer(path):
        out += path[position : match.start()]
        if match.group(1) is None:
            raise BadTarget("a malformed percent escape in the path")
        value = int(match.group(1), 16)
        if value in _SPECIAL:
            raise BadTarget(f"an encoded %{match.group(1).decode()} in the path (spell it plainly)")
        out.append(value)
        position = match.end()
    out += path[position:]
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise BadTarget("the path is not valid UTF-8 once decoded") from None


def check_pattern(pattern: str) -> str | None:
    """Why a `paths` entry is malformed (None: it is fine). An entry is `METHOD /path`, METHOD
    an upper-case method or `*`, the path exact or ending in `/*` for everything below it."""
    if not _PATTERN.match(pattern):
        return (
            f"'{pattern}' must be 'METHOD /path' (e.g. 'POST /v1/messages'; METHOD may be *, "
            "and a path ending in /* allows what is below it)"
        )
    return None


def allowed(patterns: tuple[str, ...] | None, method: str, path: str) -> bool:
    """Whether ``method path`` is on the route's list (no list: every path)."""
    if patterns is None:
        return True
    for pattern in patterns:
        want_method, _, want_path = pattern.partition(" ")
        if want_method not in ("*", method):
            continue
        if want_path.endswith("/*"):
            if path.startswith(want_path[:-1]) and len(path) > len(want_path) - 1:
                return True
        elif path == want_path:
            return True
    return False
