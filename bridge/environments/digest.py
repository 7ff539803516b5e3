"""The digest of a cache entry's files, and its check beside a task's work (`FilesCheck`): a
listing of the whole tree by GNU find (one lstat per entry, in a process of its own), hashed
as it is read."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.environments.cache import Entry


def files_changed(entry: Entry, started: Callable[[int], None] | None = None) -> str | None:
    """Why ``entry``'s files cannot be trusted, or None when their digest is the record's (the
    listing at the lowest CPU priority; ``started`` is told its process id)."""
    try:
        digest = _listing_digest(entry.outputs, background=True, started=started)
    except OSError:
        return "its files could not be read"
    return None if digest == entry.record["digest"] else "its files changed since it was made"


class FilesCheck:
    """`files_changed` of an entry, started the moment the entry is picked (a thread waiting on
    find, which runs at the lowest priority): at 50,000 files of node_modules the listing takes
    0.18 s of CPU, and nothing needs its answer before verification (the worker is untrusted
    whatever it runs on). `result` waits for it; a check that died unfinished is a failed one."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self._why: str | None = "its files were not checked"
        self._pid: int | None = None
        self._thread = threading.Thread(target=self._run, name="wb-entry-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._why = files_changed(self.entry, started=self._started)

    def _started(self, pid: int) -> None:
        self._pid = pid

    def result(self, wait: Callable[[], None] = lambda: None) -> str | None:
        """Why the entry's files cannot be trusted, or None. Waits for the check, at this
        process's own priority from now on (where it may raise it: as root); ``wait`` is called
        while it runs (it may raise to give up: a cancel, a deadline)."""
        if self._thread.is_alive() and self._pid is not None:
            try:  # (not yet reaped while the thread lives: the pid is still find's)
                os.setpriority(os.PRIO_PROCESS, self._pid, os.getpriority(os.PRIO_PROCESS, 0))
            except OSError:
                pass
        while True:
            self._thread.join(0.2)
            if not self._thread.is_alive():
                return self._why
            wait()


# One record per entry under the root, never following a link: type, permission bits, owner,
# size, modification time (not a folder's: its entries are records of their own), link target
# and path, each field NUL-terminated (no name holds a NUL). In the folders' own order, as a
# walk of them is; an unchanged tree lists the same.
_LISTING = (
    "-mindepth",
    "1",
    "(",
    "-type",
    "d",
    "-printf",
    r"d\0%m\0%U:%G\0%s\0\0\0%P\0",
    ")",
    "-o",
    "-printf",
    r"%y\0%m\0%U:%G\0%s\0%T@\0%l\0%P\0",
)
_FIELDS = 7


def tree_digest(root: Path) -> tuple[str, int, int]:
    """A digest of a tree's names, types, modes, owners, sizes, file mtimes and link targets (not
    the content, which would cost a read of every byte at every use), with its file count and
    bytes. A write in place changes a file's mtime; sealed files are the host's: only it could."""
    tally = _Tally()
    digest = _listing_digest(root, tally.feed)
    return digest, tally.files, tally.size


class _Tally:
    """The files (whatever is not a folder) and their bytes in a listing, counted as it streams
    in: a record is `_FIELDS` fields, each NUL-terminated, the first its type, the fourth its
    size. Only the field being read is held, not the listing (5 MB at 50,000 files)."""

    def __init__(self) -> None:
        self.files = self.size = 0
        self._rest = b""  # the field the last chunk ended inside
        self._at = 0  # which field of its record the next one is
        self._kind = b""

    def feed(self, chunk: bytes) -> None:
        *done, self._rest = (self._rest + chunk).split(b"\0")
        for value in done:
            if self._at == 0:
                self._kind = value
            elif self._at == 3 and self._kind != b"d":
                self.files += 1
                self.size += int(value)
            self._at = (self._at + 1) % _FIELDS


def _listing_digest(
    root: Path,
    keep: Callable[[bytes], object] | None = None,
    *,
    background: bool = False,
    started: Callable[[int], None] | None = None,
) -> str:
    """The digest of GNU find's listing of ``root`` (`_LISTING`). find stats every entry in a
    process of its own, so a check beside a task's work holds none of this process's time (a
    walk here held its interpreter lock for 0.3 s at 50,000 files); ``background``: at the
    lowest CPU priority, behind the task's own work. OSError when the tree cannot be listed."""
    proc = subprocess.Popen(
        ["find", os.path.abspath(root), *_LISTING],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    listed = False
    try:
        if background:
            try:
                os.setpriority(os.PRIO_PROCESS, proc.pid, 19)
            except OSError:
                pass  # it has ended already
        if started is not None:
            started(proc.pid)
        h = hashlib.sha256()
        stdout = proc.stdout
        assert stdout is not None
        with stdout:
            for chunk in iter(lambda: stdout.read(1 << 16), b""):
                h.update(chunk)
                if keep is not None:
                    keep(chunk)
        listed = True
    finally:
        if not listed:
            proc.kill()  # the read failed: never leave it running, nor unreaped
        code = proc.wait()
    if code != 0:
        raise OSError(
            f"find could not list all of {root} (exit {code}): a folder in it could not be read, "
            "or this host's find is not GNU find (findutils), which worker-bridge needs"
        )
    return h.hexdigest()
