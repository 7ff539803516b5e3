"""What a worker may ask, and how its asking is read: the prompt's instructions, the one
`worker-bridge-request` block of a final message (parsed only in its exact shape, bounded; the
worker is the attacker, so anything else is ignored), the message that resumes a worker with
the answers, and the requests as the task result shows them. The store keeps them
(bridge/store/requests.py); answering is bridge/pipeline/answer.py."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge.documents import AskedRequest, RequestDetail, RequestDoc, RequestRecord
    from bridge.models import JsonObject, TaskSpec
    from bridge.redact import Redactor

INFO_STRING = "worker-bridge-request"
MAX_BLOCK = 4000  # characters of the block's JSON
MAX_FINAL_MESSAGE = 64_000  # characters at the end of a final message read for the block
MAX_TEXT = 1000  # characters of a question or a reason
MAX_CHOICES = 10
MAX_CHOICE = 200
MAX_PATHS = 20
MAX_GLOB = 200

# How the prompt tells a worker to ask (added to the first turn's prompt; see workers.base).
ASKING = f"""
If you cannot finish without something you were not given, you may ask, once, at the very end
of your final message, with exactly one fenced block whose info string is {INFO_STRING}:
```{INFO_STRING}
{{"kind": "question", "text": "your question", "choices": ["optional", "answers"]}}
```
or, to change protected paths (verification.protected_paths) you need to change:
```{INFO_STRING}
{{"kind": "paths", "paths": ["tests/**"], "reason": "why"}}
```
Then stop: the answer comes back to you in this session. Names the network proxy refused are
asked for automatically."""

_FENCE = re.compile(r"^```[ \t]*([^\s`]*)[ \t]*$", re.M)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What a terminal or a reader would take for something else in a question or a reason: C0 and
# C1 controls but newline and tab (escape sequences: a cleared screen, a forged line), and the
# bidirectional overrides (text shown reversed). Replaced by U+FFFD, so the caller sees that
# something was there.
_UNSHOWN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def parse_request_block(message: str | None) -> AskedRequest | None:
    """The request in a final message: exactly one `worker-bridge-request` block holding one
    JSON object of an allowed shape; None for anything else (no block, several, malformed,
    unknown keys, wrong types, too large)."""
    if not message or INFO_STRING not in message:
        return None
    bodies = _blocks(message)
    if len(bodies) != 1 or len(bodies[0]) > MAX_BLOCK:
        return None
    try:
        data = json.loads(bodies[0])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if data.get("kind") == "question":
        return _question(data)
    if data.get("kind") == "paths":
        return _paths(data)
    return None


def _blocks(message: str) -> list[str]:
    """The bodies of the message's `worker-bridge-request` fences (an unclosed one counts as
    an empty body: not a block in its exact shape, and it makes the message ambiguous)."""
    bodies: list[str] = []
    fences = list(_FENCE.finditer(message))
    i = 0
    while i < len(fences):
        opening = fences[i]
        closing = fences[i + 1] if i + 1 < len(fences) else None
        if opening.group(1) == INFO_STRING:
            bodies.append(message[opening.end() : closing.start()].strip() if closing else "")
        elif INFO_STRING in opening.group(1):
            bodies.append("")  # a look-alike info string: ambiguous, so nothing is taken
        i += 2
    return bodies


def _text(value: Any, limit: int) -> str | None:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        return None
    return _UNSHOWN.sub("\ufffd", value.strip())


def _question(data: JsonObject) -> AskedRequest | None:
    if set(data) - {"kind", "text", "choices"}:
        return None
    text = _text(data.get("text"), MAX_TEXT)
    if text is None:
        return None
    detail: RequestDetail = {"text": text}
    if "choices" in data:
        choices = data["choices"]
        if not isinstance(choices, list) or not 0 < len(choices) <= MAX_CHOICES:
            return None
        # A choice is typed back as the answer: one with a control character is refused whole.
        clean = [_text(c, MAX_CHOICE) if not _CONTROL.search(str(c)) else None for c in choices]
        if any(c is None for c in clean):
            return None
        detail["choices"] = [c for c in clean if c is not None]
    return {"kind": "question", "detail": detail}


def check_glob(glob: Any) -> str | None:
    """A repository-relative glob, or None: no absolute path, no `..`, no control
    characters, no empty segment, bounded."""
    if not isinstance(glob, str) or not glob.strip() or len(glob) > MAX_GLOB:
        return None
    glob = glob.strip()
    if glob.startswith("/") or "\\" in glob or _CONTROL.search(glob):
        return None
    parts = glob.rstrip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    return glob


def _paths(data: JsonObject) -> AskedRequest | None:
    if set(data) != {"kind", "paths", "reason"}:
        return None
    paths, reason = data["paths"], _text(data["reason"], MAX_TEXT)
    if reason is None or not isinstance(paths, list) or not 0 < len(paths) <= MAX_PATHS:
        return None
    clean = [check_glob(p) for p in paths]
    if any(p is None for p in clean):
        return None
    globs = [p for p in dict.fromkeys(clean) if p is not None]
    return {"kind": "paths", "detail": {"paths": globs, "reason": reason}}


def resume_message(answered: list[RequestRecord]) -> str:
    """What the next turn tells the worker: each request and its answer (as given: this is
    executed, so it is not redacted; the `task.answer` events are)."""
    lines = ["Your requests were answered:"]
    for request in answered:
        detail, answer = request.detail, request.answer or {}
        if request.kind == "network":
            what = f"network access to {detail.get('host')}:{detail.get('port')}"
            verdict = {
                "approved": "approved: it is now allowed through the proxy; try again",
                "denied": "denied",
                "expired": "not answered in time: treat it as denied",
            }.get(request.status, request.status)
        elif request.kind == "paths":
            what = "changing protected paths " + ", ".join(detail.get("paths") or [])
            verdict = {
                "approved": "approved: you may change exactly these paths",
                "denied": "denied: leave them unchanged",
                "expired": "not answered in time: leave them unchanged",
            }.get(request.status, request.status)
        else:
            what = f"your question {json.dumps(detail.get('text', ''))}"
            if request.status == "answered":
                verdict = f"answered: {answer.get('text', '')}"
            else:
                verdict = "not answered: decide yourself"
        lines.append(f"- {what}: {verdict}.")
    lines.append("Carry on with the task.")
    return "\n".join(lines)


def request_document(request: RequestRecord, redactor: Redactor) -> RequestDoc:
    """One request as the task result shows it (the contract's shape, and a few facts more)."""
    doc: RequestDoc = {
        "request_id": request.request_id,
        "kind": request.kind,
        "detail": redactor.redact_data(request.detail),
        "status": request.status,
        "at": request.at,
    }
    if request.kind == "network":
        doc["attempts"] = request.attempts
    if request.answer:
        doc["answer"] = redactor.redact_data(request.answer)
    return doc


# -- what the approvals allow: one home for the gateway, the checks and the result ------------


def listed_domains(spec: TaskSpec, *, asking: bool) -> list[str] | None:
    """The patterns the worker's proxy lets through: network.domains (with `allowlist`); an
    empty list with `none` when the task asks; None: the proxy refuses everything. Approved
    names are no patterns: each approval is for its (name, port) alone."""
    return listed_patterns(spec.network.mode, spec.network.domains, asking=asking)


def listed_patterns(mode: str, domains: list[str], *, asking: bool) -> list[str] | None:
    """listed_domains from a spec's network ``mode`` and ``domains``, as they are stored."""
    if mode == "allowlist":
        return [d.strip().lower().rstrip(".") for d in domains]
    return [] if asking else None


def approved_hosts(requests: list[RequestRecord]) -> list[str]:
    """``host:port`` of each approved network request (an approval opens that port alone)."""
    return [
        f"{r.detail['host']}:{r.detail.get('port')}"
        for r in requests
        if r.kind == "network" and r.status == "approved" and r.detail.get("host")
    ]


def approved_paths(requests: list[RequestRecord]) -> list[str]:
    """The protected paths the approved path requests let the task change."""
    return [
        path
        for r in requests
        if r.kind == "paths" and r.status == "approved"
        for path in r.detail.get("paths") or []
    ]
