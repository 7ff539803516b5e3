"""What a person is shown of what a worker wrote, the same in every front end (the CLI's live
view and `tasks show`, the web view's event stream): text made safe for a terminal or a page
(`terminal_safe`), one field kept to one line (`one_line`), an event as one line for a person
(`describe`) and a worker's request in a few words (`describe_request`)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI's SafeStream loads this module at start-up: no pydantic there
    from bridge.documents import AskedRequest, Coverage, RequestDetail
    from bridge.records import Event

# What a terminal would act on rather than show: C0 controls but tab and newline (ESC starts
# escape sequences, CR rewrites a line), DEL, C1 controls (0x9b is CSI), line separators, and
# (INVISIBLE below) the bidirectional overrides that reorder what is shown. Each is shown as its
# escape instead.
_UNSAFE = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F)}
_UNSAFE.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})
_UNSAFE.update({0x2028: "\\u2028", 0x2029: "\\u2029"})  # line and paragraph separators

# Code points no one sees (Unicode's Default_Ignorable_Code_Point: zero-width characters, tag
# characters, variation selectors, fillers, the soft hyphen): a string spelt in them shows as
# nothing, so a payload a decoder turns into code (`eval(untag("..."))`) would be invisible in
# a diff, a summary or a judge's prompt. Each is shown as its escape, here and in the readable
# diff (bridge/workspace/readable.py); the web view's common.js lists the same ranges.
INVISIBLE_RANGES = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
INVISIBLE = re.compile(
    "[" + "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in INVISIBLE_RANGES) + "]"
)


def escape_invisible(text: str) -> str:
    """``text`` with each code point no one sees as its escape (`\\u200b`, `\\U000e0063`)."""
    return INVISIBLE.sub(lambda m: _escape(ord(m.group())), text)


def _escape(c: int) -> str:
    return f"\\u{c:04x}" if c <= 0xFFFF else f"\\U{c:08x}"


def terminal_safe(text: str) -> str:
    return escape_invisible(text.translate(_UNSAFE))


def one_line(text: object) -> str:
    """A field of one line: newlines in what a worker wrote cannot start lines of their own
    (a summary cannot print a fake `verification: ok` under the real one)."""
    return str(text).replace("\r", "\\r").replace("\n", "\\n")


def describe_request(request: AskedRequest, attempts: int = 1) -> str:
    """What a request asks for, in a few words (tasks show, the live view, the web view);
    ``attempts``: of a network request, the refused attempts counted."""
    detail = request.get("detail") or {}
    if request["kind"] == "network":
        return f"reach {detail.get('host')}:{detail.get('port')} ({attempts} attempt(s))"
    if request["kind"] == "paths":
        covered = detail.get("covers") or {}
        paths = [
            f"{p} ({_coverage(covered[p])})" if p in covered else p
            for p in detail.get("paths") or []
        ]
        return f"change {', '.join(paths)}: {detail.get('reason', '')}"
    choices = detail.get("choices")
    return str(detail.get("text", "")) + (f" [{' | '.join(choices)}]" if choices else "")


def _coverage(covered: Coverage | int) -> str:
    """What one glob covers: the base's protected files it matches, those the worker added,
    and the paths the request names (a request an older version recorded has the count)."""
    if isinstance(covered, int):
        return f"{covered} protected file(s)"
    words = f"{covered['base']} protected file(s) in the base"
    if covered["added"]:
        words += f", {covered['added']} the worker added"
    paths = covered["paths"]
    unnamed = covered["base"] + covered["added"] - len(paths)
    if paths:
        words += ": " + ", ".join(paths) + (f" and {unnamed} more" if unnamed > 0 else "")
    return words


def describe(event: Event) -> str | None:
    """One line for a person, or None for an event not worth showing live."""
    kind, data = event.kind, event.data
    if kind == "worker.progress":
        name = data.get("name")
        label = data.get("kind", "message")
        head = f"{label} {name}" if name else label
        text = data.get("text", data.get("line", ""))
        return f"  {head}: {text}" if label != "message" else f"  {text}"
    if kind == "worker.started":
        turn = data.get("turn", 0)
        return f"worker {data.get('worker', '')} started" + (f" (turn {turn})" if turn else "")
    if kind == "worker.completed":
        return f"worker exited with status {data.get('exit_code')}"
    if kind == "verification.command":
        status = data.get("status") or ("passed" if data.get("exit_code") == 0 else "failed")
        return f"  check `{data.get('command', '')}`: {status}"
    if kind == "verification.auto_repair":
        return f"repair turn {data.get('repair')}: `{data.get('command', '')}` failed"
    if kind == "environment.setup":
        status = data.get("status")
        if status == "started":
            count = len(data.get("commands") or [])
            return f"environment setup ({data.get('reason', '')}): {count} command(s)"
        if status == "command":
            return f"  setup `{data.get('command', '')}`: exit {data.get('exit_code')}"
        return f"environment ready in {data.get('duration_s')} s"
    if kind == "environment.output":
        return f"  {data.get('text', '')}"
    if kind == "environment.cached":
        return "environment from the cache"
    if kind == "environment.cache_corrupt":
        return f"environment cache not trusted ({data.get('reason', '')}): setting up again"
    if kind == "environment.build":
        return f"building the environment image from {data.get('dockerfile', '')}"
    if kind == "task.request":
        given = data.get("detail")
        detail: RequestDetail = given if given else {}
        request: AskedRequest = {"kind": data.get("kind", ""), "detail": detail}
        return (
            f"request {data.get('request_id', '')} ({request['kind']}): "
            f"{describe_request(request)}; answer with `worker-bridge tasks answer "
            f"{event.task_id} {data.get('request_id', '')} (--approve | --deny | --text TEXT)`"
        )
    if kind == "task.answer":
        return f"request {data.get('request_id', '')}: {data.get('status', '')}"
    if kind == "task.status" and data.get("to") == "waiting_input":
        return "waiting for input (the task resumes once its requests are answered)"
    if kind == "network.refused":
        return f"  network refused: {data.get('host', '')} ({data.get('reason', '')})"
    # Status changes are not lines of their own: the terminal's status line shows them, the
    # result says how it ended, and a task refused before its worker starts (a missing image,
    # no engine) explains itself in the one error line alone.
    return None
