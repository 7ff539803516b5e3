"""What a change shows a person and a judge: the task's diff with each file git shows as binary
given as its text, bytes that are not text escaped, and the lines each such file counts.

`git diff --binary` (the patch accept applies) shows a file with a NUL in its first 8,000 bytes,
or one the repository's attributes mark binary, as base85: a shell script with a NUL after its
first line still runs past it, while its diff shows nothing of it and counts no line. The
readable diff gives such a file as `git diff --text` does, under a line saying so, when it is
new, was text in the base or comes from another path (a rename or copy: *flagged*), and as
git's `Binary files ... differ` when it was binary at the same path in the base (an image
changed). Throughout, NULs, other control bytes but tab and newline, a CR that does not end a
line and bytes that are not UTF-8 are shown as `\\xNN`, and code points no one sees (zero-width
and tag characters, variation selectors: bridge/display.py's INVISIBLE) as `\\uXXXX`. Every
file's text counts the same way: each line added or removed once per 80 bytes started, a lone
CR ending a line as a newline does (Python and others run it so), so neither a binary file nor
a module on one long line makes a change look smaller than the same code written plainly."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bridge.display import INVISIBLE, escape_invisible
from bridge.documents import BinaryNote
from bridge.errors import GitError
from bridge.workspace.diff import Change, git_diff
from bridge.workspace.git import Git
from bridge.workspace.writer import BlobReader

LINE_BYTES = 80  # a binary file's line counts once per this many bytes started
TEXT_PROBE = 8000  # git's own test: a NUL in a file's first 8,000 bytes makes it binary

SHOWN = (
    b"# worker-bridge: git shows this file as binary; its text follows, NULs and other bytes "
    b"that are not text escaped as \\xNN\n"
)
KEPT = (
    "# worker-bridge: git shows this file as binary, as it was in the base; its text counts "
    "{added} line(s) added and {removed} removed\n"
)

_BINARY_PATCH = b"\nGIT binary patch\n"
# What is not text, in the diff's bytes (C1 controls as UTF-8 too) and in its decoded text.
_NOT_TEXT = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)|\xc2[\x80-\x9f]")
_NOT_TEXT_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]|\r(?!\n)")
_MOVED = re.compile(rb"(?m)^(?:rename|copy) from ")
_SECTION = re.compile(rb"(?m)^(?=diff --git )")
_INDEX = re.compile(rb"(?m)^index ([0-9a-f]+)\.\.([0-9a-f]+)")


@dataclass(frozen=True)
class Readable:
    """The readable diff (the diff itself when nothing in it needs reading) and what git shows
    as binary of the change, by path."""

    path: Path
    size: int
    sha256: str
    binary: dict[str, BinaryNote]


def write_readable(
    repo: Path, base: str, snapshot: str, diff: Path, dest: Path, changes: list[Change]
) -> Readable:
    """The readable form of ``diff`` (base -> snapshot, ``changes`` its `--raw` entries),
    written to ``dest`` when it differs from ``diff``."""
    data = diff.read_bytes()
    if not _needs_reading(data):
        dest.unlink(missing_ok=True)  # an earlier turn's
        return Readable(diff, len(data), hashlib.sha256(data).hexdigest(), {})
    binary = [(_key(s), _shas(s)) for s in _sections(data) if _BINARY_PATCH in s]
    texts = _texts(repo, base, snapshot, {key for key, _ in binary}) if binary else {}
    heads = _nul_in_head(Git(repo), [sha for _, shas in binary for sha in shas if sha])
    owners = _owners(changes)
    notes: dict[str, BinaryNote] = {}
    digest, size = hashlib.sha256(), 0
    with dest.open("wb") as out:
        for section in _sections(data):
            if _BINARY_PATCH in section:
                section = _readable_section(section, texts, heads, owners, notes)
            shown = readable_text(section).encode()
            out.write(shown)
            digest.update(shown)
            size += len(shown)
    return Readable(dest, size, digest.hexdigest(), notes)


def readable_text(data: bytes) -> str:
    """``data`` as text: bytes that are not UTF-8, control bytes but tab and newline, and a CR
    that does not end a line, as `\\xNN`; code points no one sees as `\\uXXXX`."""
    text = data.decode("utf-8", "backslashreplace")
    text = _NOT_TEXT_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return escape_invisible(text)


def changed_lines(lines: Iterable[bytes], width: int = LINE_BYTES) -> tuple[int, int]:
    """(added, removed) lines of a unified diff's ``lines``, read inside hunks only (a line
    `+++ x` in a hunk is an added line `++ x`, not a header); a line counts once per ``width``
    bytes started, and a CR inside it ends a line as a newline would."""
    added = removed = 0
    in_hunk = False
    for line in lines:
        first = line[:1]
        if line.startswith(b"@@"):
            in_hunk = True
        elif line.startswith(b"diff --git "):
            in_hunk = False
        elif in_hunk and first in (b"+", b"-"):
            body = line[1:].rstrip(b"\n").removesuffix(b"\r")  # CRLF ends one line
            weight = sum(max(1, -(-len(part) // width)) for part in body.split(b"\r"))
            if first == b"+":
                added += weight
            else:
                removed += weight
    return added, removed


def _sections(data: bytes) -> Iterator[bytes]:
    """The diff's sections, one per `diff --git` line (each a copy, one at a time)."""
    starts = [m.start() for m in _SECTION.finditer(data)]
    if not starts or starts[0]:
        starts.insert(0, 0)
    for start, end in zip(starts, [*starts[1:], len(data)], strict=True):
        if end > start:
            yield data[start:end]


def _needs_reading(data: bytes) -> bool:
    """Whether the diff shows a file as binary or holds bytes that are not text."""
    if _BINARY_PATCH in data or _NOT_TEXT.search(data):
        return True
    if data.isascii():
        return False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return INVISIBLE.search(text) is not None


def _readable_section(
    section: bytes,
    texts: dict[tuple[bytes, ...], bytes],
    heads: dict[str, bool],
    owners: dict[tuple[str, str], list[Change]],
    notes: dict[str, BinaryNote],
) -> bytes:
    """A binary section as the readable diff shows it (its text when flagged, git's `Binary
    files` line otherwise), its figures noted on the changed paths it belongs to."""
    text = texts.get(_key(section))
    if text is None:  # the two diffs pair the same files: this would be git changing its mind
        raise GitError("git diff --text left out a file git diff --binary shows as binary.")
    added, removed = changed_lines(text.split(b"\n"))
    old, new = _shas(section)
    # Binary in the base at this very path, or it is flagged: a renamed or copied image whose
    # bytes now start with a script is new code at its new path, whatever its source was.
    moved = _MOVED.search(section[: section.index(_BINARY_PATCH)]) is not None
    flagged = bool(new) and not (old and not moved and heads.get(old))
    for change in owners.get((old, new), []):
        note = notes.setdefault(
            change.path,
            BinaryNote(flagged=False, holds_nul=False, lines_added=0, lines_removed=0),
        )
        note["flagged"] = note["flagged"] or flagged
        note["holds_nul"] = note["holds_nul"] or bool(flagged and heads.get(new))
        note["lines_added"] += added
        note["lines_removed"] += removed
    if flagged:
        at = text.find(b"\n--- ") + 1 or text.find(b"\n") + 1
        return text[:at] + SHOWN + text[at:]
    header = section[: section.index(_BINARY_PATCH) + 1]
    kept = KEPT.format(added=added, removed=removed).encode()
    return header + kept + _binary_files_line(header)


def _binary_files_line(header: bytes) -> bytes:
    """git's own `Binary files A and B differ` for a section's header."""
    first = header.split(b"\n", 1)[0].removeprefix(b"diff --git ")
    half = (len(first) - 1) // 2  # `a/NAME b/NAME`: the same name twice
    old, new = first[:half], first[half + 1 :]
    source = re.search(rb"(?m)^rename from (.*)$", header)
    target = re.search(rb"(?m)^rename to (.*)$", header)
    if source and target:
        old, new = b"a/" + source[1], b"b/" + target[1]
    if re.search(rb"(?m)^new file mode ", header):
        old = b"/dev/null"
    if re.search(rb"(?m)^deleted file mode ", header):
        new = b"/dev/null"
    return b"Binary files " + old + b" and " + new + b" differ\n"


def _texts(
    repo: Path, base: str, snapshot: str, wanted: set[tuple[bytes, ...]]
) -> dict[tuple[bytes, ...], bytes]:
    """`git diff --text` of the change, the sections ``wanted`` by their key (the same files
    as in the binary diff, whose options it shares: the same pairs of files, in any order)."""
    found = {}
    for section in _sections(git_diff(repo, base, snapshot, "--text")):
        if (key := _key(section)) in wanted:
            found[key] = section
    return found


def _key(section: bytes) -> tuple[bytes, ...]:
    """A section's `diff --git` line and the blobs of its `index` line: one file's pair, the
    same in `--binary` and `--text` (a type change's two sections differ by their blobs)."""
    index = _INDEX.search(section)
    return (section.split(b"\n", 1)[0], *(index.groups() if index else ()))


def _shas(section: bytes) -> tuple[str, str]:
    """The (old, new) blobs of a section's `index` line, "" for a side that does not exist."""
    index = _INDEX.search(section)
    if index is None:
        return "", ""
    old, new = (sha.decode() for sha in index.groups())
    return ("" if not old.strip("0") else old), ("" if not new.strip("0") else new)


def _owners(changes: list[Change]) -> dict[tuple[str, str], list[Change]]:
    """The changed paths by the (old, new) blobs of their sections (a type change has two)."""
    owners: dict[tuple[str, str], list[Change]] = {}
    for change in changes:
        old, new = change.old_sha or "", change.sha or ""
        pairs = [(old, ""), ("", new)] if change.change == "type_changed" else [(old, new)]
        for pair in pairs:
            owners.setdefault(pair, []).append(change)
    return owners


def _nul_in_head(git: Git, shas: Iterable[str]) -> dict[str, bool]:
    """Whether each blob holds a NUL in its first 8,000 bytes (git's test of binary content,
    whatever the attributes say)."""
    wanted = sorted(set(shas))
    if not wanted:
        return {}
    reader = BlobReader(git)
    try:
        blobs = zip(wanted, reader.stream(wanted), strict=True)
        return {sha: b"\0" in blob[:TEXT_PROBE] for sha, blob in blobs}
    finally:
        reader.close()
