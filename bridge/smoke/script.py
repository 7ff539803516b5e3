"""What the scripted model does (bridge/smoke/model_server.py serves it): the directives written
into a task's own text, read out of the conversation an API module parsed, and the action they
choose: write a file with the CLI's tool, give a final message, refuse the key, or hang."""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIRECTIVE = re.compile(
    r"^@(write|repair-write|follow-write|say|fail-auth|hang)\b[ \t]*(.*)$", re.M
)


@dataclass(frozen=True)
class Write:
    path: str
    content: str


@dataclass(frozen=True)
class Final:
    text: str


@dataclass(frozen=True)
class Refuse:
    """Answer 401 as the provider does."""


@dataclass(frozen=True)
class Hang:
    """Never answer."""


Action = Write | Final | Refuse | Hang


@dataclass
class Conversation:
    """What an API module reads out of a request, in the same terms for every API."""

    user_texts: list[str]  # the user's messages, oldest first (tool results left out)
    after_tool: bool  # the last message is a tool's result
    has_tools: bool  # the request offers tools (a title call does not)
    model: str | None = None


def _directives(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2).strip()) for m in _DIRECTIVE.finditer(text)]


def _write(arg: str) -> Write:
    path, _, content = arg.partition(":")
    return Write(path.strip(), content.strip().replace("\\n", "\n"))


def decide(conv: Conversation) -> Action:
    """What the scripted model does next."""
    everything = "\n".join(conv.user_texts)
    said = [arg for name, arg in _directives(everything) if name == "say"]
    final = Final(said[-1].replace("\\n", "\n") if said else "Done.")
    if not conv.has_tools:
        return Final("A scripted title")
    latest = conv.user_texts[-1] if conv.user_texts else ""
    own = _directives(latest)
    if any(name == "hang" for name, _ in own):
        return Hang()
    if any(name == "fail-auth" for name, _ in own):
        return Refuse()
    if conv.after_tool:
        return final
    if len(conv.user_texts) > 1 or "Verification failed" in latest:
        wanted = "repair-write" if "Verification failed" in latest else "follow-write"
        for name, arg in _directives(everything):
            if name == wanted:
                return _write(arg)
    for name, arg in own:
        if name == "write":
            return _write(arg)
    return final
