"""The cache of setup results. An entry is the image the setup's commands left (committed after
each command) and the ignored files they made inside the repository (`node_modules`, `.venv`),
kept under `<home>/environments/<key>/`, keyed by what the setup depends on (see `setup_key`).

An entry is made in a folder of its own and renamed into place whole, under the key's lock, so a
reader sees a complete entry or none. Its record and its image's id are checked before each use,
and its files (a digest of the whole tree, which grows with it) by a low-priority find beside the
task's other work, confirmed before verification trusts them (`FilesCheck`, digest.py), or, once
its view is sealed, by that view's image alone, which is then all the task reads (sealed.py); an
entry that fails a check is removed and made again, never trusted. Cached files are the host's
(root-owned and read-only when the bridge runs as root): they are hard-linked into a task's
worktree and verification checkouts, which the sandbox user can add to and unlink from but never
write through to the cache.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bridge.environments.sealed import SealBroken, is_sealed, seal_image, sealed_tree
from bridge.sandbox.spec import home_id
from bridge.workspace.bases import bases_root, private_folder
from bridge.workspace.fs import remove_tree, walk_all
from bridge.workspace.locks import bases_lock

KEY_VERSION = 3  # 3: the files' digest is of find's listing (digest.py's `tree_digest`)
ENTRY_FILE = "entry.json"
OUTPUTS = "outputs"


def setup_key(
    image_id: str,
    commands: tuple[str, ...],
    container_env: dict[str, str],
    setup_network: tuple[str, ...],
    files: dict[str, str],
    *,
    repository: str,
) -> str:
    """The cache key: the repository, the environment image's id, the setup commands, the
    environment they run with and may reach, and the content (git blob ids) of the dependency
    files."""
    document = {
        "v": KEY_VERSION,
        "repository": repository,
        "image": image_id,
        "setup": list(commands),
        "env": dict(sorted(container_env.items())),
        "network": sorted(setup_network),
        "files": dict(sorted(files.items())),
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def cache_root(home: Path) -> Path:
    return home / "environments"


def image_tag(home: Path, key: str, task_id: str | None = None) -> str:
    """The setup image's tag: the key's, in this state root (another root on the same engine
    keeps its own), and the task's for a task-private setup."""
    return f"worker-bridge-env:{key[:32]}-{home_id(home)}" + (f"-{task_id}" if task_id else "")


@dataclass
class Entry:
    key: str
    folder: Path
    record: dict

    @property
    def image(self) -> str:
        return str(self.record["image"])

    @property
    def image_id(self) -> str:
        return str(self.record["image_id"])

    @property
    def outputs(self) -> Path:
        return self.folder / OUTPUTS

    def touch(self) -> None:
        """Mark the entry used now (prune removes the least recently used first)."""
        try:
            os.utime(self.folder / ENTRY_FILE)
        except OSError:
            pass

    @property
    def last_used(self) -> float:
        try:
            return (self.folder / ENTRY_FILE).stat().st_mtime
        except OSError:
            return 0.0


def load_entry(folder: Path) -> Entry | None:
    """The entry in ``folder`` if its record reads back whole (not yet checked against the
    engine or its files: see `check_entry`)."""
    try:
        record = json.loads((folder / ENTRY_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not all(
        isinstance(record.get(k), str) for k in ("key", "image", "image_id", "digest")
    ):
        return None
    return Entry(str(record["key"]), folder, record)


def check_entry(entry: Entry, image_id: Callable[[str], str | None]) -> str | None:
    """Why ``entry`` cannot be trusted (one phrase), or None when its record, its image and the
    folder of its files are whole; its files themselves are `FilesCheck`'s."""
    if entry.key != entry.folder.name:
        return "its record names another key"
    found = image_id(entry.image)
    if found is None:
        return f"its image {entry.image} is gone"
    if found != entry.image_id:
        return f"its image {entry.image} is not the one it made"
    if not entry.outputs.is_dir():
        return "its files are gone"
    return None


@contextmanager
def key_lock(home: Path, key: str, *, wait: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Hold the key's lock (one setup per key at a time, all processes together); ``wait`` is
    called while another holds it (it may raise to give up: a cancel, a deadline)."""
    root = cache_root(home)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / f".{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                wait()
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def seal(outputs: Path) -> None:
    """Make the cached files read-only for everyone (and never setuid): hard links share the
    inode, so this is what keeps a task from writing through a link into the cache."""
    for rel, st in walk_all(outputs):
        if stat.S_ISREG(st.st_mode):
            os.chmod(outputs / rel, stat.S_IMODE(st.st_mode) & 0o555)


def materialize(outputs: Path, dest: Path, owner: tuple[int, int] | None) -> int:
    """Put the cached files into ``dest`` (a worktree or checkout no container is using): each
    folder made (the sandbox user's), each file hard-linked (copied when the bridge is not
    root: the sandbox user would own the cache's files and could write through a link; and
    where no link can cross into ``dest``, an overlay's merged view), each
    link copied as a link. What ``dest`` already holds wins (a tracked file is the snapshot's).
    Returns the number of entries added."""
    added = 0
    skipped: list[str] = []
    for rel, st in walk_all(outputs):
        if any(rel == s or rel.startswith(s + "/") for s in skipped):
            continue
        target = dest / rel
        try:
            existing = os.lstat(target)
        except FileNotFoundError:
            existing = None
        if stat.S_ISDIR(st.st_mode):
            if existing is None:
                os.mkdir(target, 0o755)
                if owner is not None:
                    os.chown(target, *owner, follow_symlinks=False)
                added += 1
            elif not stat.S_ISDIR(existing.st_mode):
                skipped.append(rel)
            continue
        if existing is not None:
            continue
        source = outputs / rel
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(source), target)
            if owner is not None:
                os.chown(target, *owner, follow_symlinks=False)
        elif stat.S_ISREG(st.st_mode):
            if owner is None or not _linked(source, target):
                shutil.copy2(source, target, follow_symlinks=False)
        else:
            continue  # FIFOs, sockets, devices are never cached (see capture)
        added += 1
    return added


def _linked(source: Path, target: Path) -> bool:
    """Hard-link ``source`` as ``target``; False where no link can cross (a layered worktree
    whose environment view could not be mounted under it: the copy is the host's as well)."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        return False
    return True


def entries(home: Path) -> list[Entry | Path]:
    """Every entry under the state root (a folder whose record does not read: its Path)."""
    return entries_in(cache_root(home))


def entries_in(root: Path) -> list[Entry | Path]:
    """Every entry in ``root`` (a folder whose record does not read: its Path)."""
    found: list[Entry | Path] = []
    if not root.is_dir():
        return found
    for folder in sorted(root.iterdir()):
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        found.append(load_entry(folder) or folder)
    return found


def remove_entry(folder: Path, image: str | None, remove_image: Callable[[str], None]) -> None:
    """Remove an entry: its folder first (so no one trusts it any more), then its image."""
    graveyard = folder.with_name(f".removing-{folder.name}-{os.urandom(4).hex()}")
    try:
        os.rename(folder, graveyard)
    except FileNotFoundError:
        return
    remove_tree(graveyard)
    if image:
        remove_image(image)


def sweep_partials(home: Path, older_than_s: float = 3600.0) -> None:
    """Remove the half-made entries and removals a dead process left."""
    root = cache_root(home)
    if not root.is_dir():
        return
    now = time.time()
    for folder in root.iterdir():
        if folder.name.startswith((".partial-", ".removing-")):
            try:
                if now - folder.lstat().st_mtime > older_than_s:
                    remove_tree(folder)
            except OSError:
                pass


def shared_view(home: Path, outputs: Path, owner: tuple[int, int] | None) -> Path:
    """The cached files as `materialize` would put them into a checkout, made once per entry
    and sandbox user under `<home>/bases/env/` (folders the sandbox user's, files hard links of
    the sealed cache), for use as a read-only lower dir of layered checkouts: the cost of
    linking node_modules is paid once, not per task and checkout. Nothing ever writes it (an
    overlay never writes its lower dirs). The view is named by the entry as made (its digest
    and the nonce and time of its record), so an entry made again, even with the same digest,
    gets another view: a view made from an entry whose check failed is never used again. A
    sealed view's tree is its image, checked and mounted (sealed.py: SealBroken, OSError)."""
    folder = view_folder(home, outputs, owner)
    with bases_lock(home):  # as a base tree: prune never removes it while a task picks it
        private_folder(bases_root(home))
        if (folder / "ready").is_file():
            os.utime(folder / "ready")
            return sealed_tree(folder) if is_sealed(folder) else folder / "tree"
        tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}-{os.urandom(3).hex()}")
        try:
            (tmp / "tree").mkdir(parents=True)
            materialize(outputs, tmp / "tree", owner)
            (tmp / "ready").write_text(f"{outputs}\n")
            if folder.exists():
                remove_tree(folder)  # a half-made one (a crash)
            tmp.rename(folder)
        finally:
            if tmp.exists():
                remove_tree(tmp)
    return folder / "tree"


def view_folder(
    home: Path, outputs: Path, owner: tuple[int, int] | None, record: dict | None = None
) -> Path:
    """Where the view of ``outputs`` (an entry's files; ``record``: the entry's record, read
    from its folder when not given) for the sandbox user ``owner`` is."""
    if record is None:
        entry = load_entry(outputs.parent)
        record = entry.record if entry is not None else {}
    stamp = "\0".join(str(record.get(k, "")) for k in ("digest", "nonce", "created_at"))
    uid = owner[0] if owner is not None else os.geteuid()
    name = hashlib.sha256(f"{outputs}\0{stamp}".encode()).hexdigest()[:24]
    return bases_root(home) / "env" / f"{name}-{uid}"


def sealed_view(home: Path, entry: Entry, owner: tuple[int, int] | None) -> Path | None:
    """The folder of ``entry``'s sealed view, its image checked by identity and mounted
    (sealed.py), or None where the view is not sealed or its image cannot be mounted here.
    SealBroken when its image is not the one sealed."""
    folder = view_folder(home, entry.outputs, owner, entry.record)
    if not is_sealed(folder):
        return None
    try:
        sealed_files(home, folder)
    except SealBroken:
        raise
    except OSError:  # its image cannot be mounted here
        return None
    return folder


def sealed_files(home: Path, folder: Path) -> Path:
    """The tree of the sealed view in ``folder``, checked and mounted: what a task given it
    reads, and nothing else. SealBroken when it is gone or not the one sealed (never made
    again from the entry's files: those were not checked for this task); OSError when it
    cannot be mounted."""
    with bases_lock(home):
        if not (folder / "ready").is_file() or not is_sealed(folder):
            raise SealBroken("its sealed view is gone")
        os.utime(folder / "ready")
        return sealed_tree(folder)


def seal_view(home: Path, entry: Entry, owner: tuple[int, int] | None) -> str | None:
    """Seal the view of ``entry`` (as checked: its record) for ``owner`` where it is made: why
    it could not, or None."""
    folder = view_folder(home, entry.outputs, owner, entry.record)
    if not (folder / "ready").is_file():
        return None
    return seal_image(folder, lambda: bases_lock(home))


def view_tree(
    home: Path, outputs: Path, owner: tuple[int, int] | None, sealed: Path | None
) -> Path:
    """The read-only tree a layered checkout puts under itself: the task's sealed view
    (``sealed``: its folder) or the entry's view (`shared_view`)."""
    return sealed_files(home, sealed) if sealed is not None else shared_view(home, outputs, owner)


def files_source(home: Path, outputs: Path, sealed: Path | None) -> Path:
    """Where a full checkout's cached files are read from: the task's sealed view's mounted
    image (its files copied: no link crosses into it) when it was given one, whose entry's own
    files it never checked; else the entry's files (linked), checked whole."""
    return sealed_files(home, sealed) if sealed is not None else outputs
