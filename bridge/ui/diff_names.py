"""The name of each file of a `git diff` as git wrote it, read exactly, for the page to show
beside diff2html's drawing: diff2html reads names out of the headers its own way (it keeps
the escapes of a name git quotes and turns their backslashes into slashes, keeps the tab git
puts after a name with a space, cuts a header with no `---`/`+++` lines at its first ` b/`,
drops what looks like a timestamp). Names are shown as the task result lists them: bytes that
are not UTF-8 as `\\xNN` escapes.

Git writes `diff --git a/NAME b/NAME` for every file (the same name twice but for a rename or
copy, which has `rename from`/`rename to` lines), each name C-quoted (`"a/tab\\there"`) when it
holds a quote, a backslash or a control character (core.quotePath is off: other bytes are
written as they are).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

HEADER = b"diff --git "
_ESCAPES = {
    ord("a"): 7,
    ord("b"): 8,
    ord("t"): 9,
    ord("n"): 10,
    ord("v"): 11,
    ord("f"): 12,
    ord("r"): 13,
    ord('"'): ord('"'),
    ord("\\"): ord("\\"),
}
_OCTAL = b"01234567"
# What ends a file's extended header: its hunks, or its binary patch.
_BODY = (b"@@", b"GIT binary patch", b"Binary files ", b"--- ", b"+++ ")


# One file of a diff as the page names it: ``path``, and ``from`` for a rename or copy (as the
# task result's changed files). (`from` is a keyword, hence the functional form.)
DiffFile = TypedDict("DiffFile", {"path": str, "from": NotRequired[str]})


def diff_files(diff: bytes) -> list[DiffFile | None]:
    """Each file of ``diff`` (git's output, whole files), in order; None for one whose header
    is not git's (the drawing's own name then stays)."""
    if not diff.startswith(HEADER):
        return []
    return [_names(chunk) for chunk in diff.split(b"\n" + HEADER)]


def _names(chunk: bytes) -> DiffFile | None:
    first, _, rest = chunk.partition(b"\n")
    old = new = None
    for line in rest.split(b"\n"):
        if line.startswith(_BODY):
            break
        for sources, targets in ((b"rename from ", b"rename to "), (b"copy from ", b"copy to ")):
            if line.startswith(sources):
                old = _whole(line[len(sources) :])
            elif line.startswith(targets):
                new = _whole(line[len(targets) :])
    if old is not None and new is not None:
        return {"path": _shown(new), "from": _shown(old)}
    name = _same_name(first.removeprefix(HEADER))
    return None if name is None else {"path": _shown(name)}


def _same_name(header: bytes) -> bytes | None:
    """NAME of `a/NAME b/NAME` (either quoted), or None when the header is not that."""
    if header.startswith(b'"'):
        old, rest = _unquote(header)
        if old is None or not rest.startswith(b" "):
            return None
        rest = rest[1:]
        new, left = _unquote(rest) if rest.startswith(b'"') else (rest, b"")
        if left or old[:2] != b"a/" or new is None or new != b"b/" + old[2:]:
            return None
        return old[2:]
    size = (len(header) - len(b"a/ b/")) // 2
    name = header[2 : 2 + size]
    return name if header == b"a/" + name + b" b/" + name else None


def _whole(text: bytes) -> bytes | None:
    """A name alone on its line: quoted, or as it is."""
    if not text.startswith(b'"'):
        return text
    name, rest = _unquote(text)
    return name if not rest else None


def _unquote(text: bytes) -> tuple[bytes | None, bytes]:
    """The C-quoted string ``text`` starts with, undone, and what follows its closing quote;
    (None, text) when it is not one."""
    out = bytearray()
    i = 1
    while i < len(text):
        c = text[i]
        if c == ord('"'):
            return bytes(out), text[i + 1 :]
        if c != ord("\\"):
            out.append(c)
            i += 1
            continue
        code = text[i + 1 : i + 4]
        if len(code) == 3 and all(d in _OCTAL for d in code):
            out.append(int(code, 8) & 0xFF)
            i += 4
        elif i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            return None, text
    return None, text


def _shown(name: bytes) -> str:
    """As the task result lists a name: bytes that are not UTF-8 as \\xNN escapes."""
    return name.decode("utf-8", "backslashreplace")
