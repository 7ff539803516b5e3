"""What crosses the network between the control host and a node is git data: the base as a
bundle (kept per node by commit), and the snapshot back as a thin bundle of its one commit.

A bundle here is git's v2 format written by us: the header (`# v2 git bundle`, one
prerequisite line per commit the receiver must have, one ref line) and then the pack
`git pack-objects --revs` makes of what the tip reaches less what the prerequisites reach
(`--thin`: deltas against the receiver's objects). Writing the header ourselves names the ref
without making one in the user's repository.

The control host trusts nothing a node sends. `receive_snapshot` reads the header (one ref,
the base as the only prerequisite), unpacks into a quarantine repository that borrows the
user's objects (so nothing of a refused bundle reaches the user's object store), with git's
fsck on (a `.git` entry, a path with `..`, a bad mode refuse the pack), and checks the commit
the way collect checks a snapshot it made itself: the base its only parent; no gitlink and no
path component naming git metadata among the changed entries; paths within MAX_PATH_BYTES;
each blob within the task's file limit, all of them within its change limit, the tree within
its entry limit. Only then does the quarantine's pack move into the user's repository and the
task's branch name the commit. Its id is the snapshot's id: what the host diffs, verifies and
accepts is what the node committed.

A node takes the control host's bundles (`unbundle`) by index-pack alone: it trusts its
control host, as it trusts the orders it gets.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import BridgeError, GitError
from bridge.workspace.git import Git
from bridge.workspace.snapshot import (
    MAX_PATH_BYTES,
    SnapshotLimits,
    is_git_dir_name,
    is_git_file_name,
)

SIGNATURE = b"# v2 git bundle\n"
BUNDLE_REF = "refs/worker-bridge/snapshot"
MAX_HEADER = 64 * 1024  # a header is a few lines: more is not a bundle of ours
PACK_SLACK = 1 << 20  # a pack's own bytes over the blobs it holds (headers, trees, the commit)
ALLOWED_MODES = {"100644", "100755", "120000"}
MAX_LINK_BYTES = 4095  # a link's target: what readlink can give (collect records no longer)
MAX_COMMIT_BYTES = 1 << 20  # a snapshot's commit: a tree, a parent, a line of message
MAX_OBJECTS_PER_ENTRY = 3  # a file's blob, and the trees above it, at most, in a change
PACK_OBJECTS_SLACK = 64
INDEX_MEMORY = 512 << 20  # index-pack's address space past the pack's own size
RECEIVE_TIMEOUT_S = 300
CHUNK = 1 << 16
_SHA = re.compile(rb"^[0-9a-f]{40}$")


class BundleRefused(BridgeError):
    """A bundle a node sent that the control host does not take (one sentence: what was wrong);
    nothing of it is left in the user's repository."""

    kind = "sandbox"


@dataclass(frozen=True)
class Header:
    prerequisites: tuple[str, ...]
    refs: tuple[tuple[str, str], ...]  # (commit, ref name)
    size: int  # bytes up to and including the blank line; the pack follows


def bundle_bytes(repo: Path, tip: str, *, exclude: str | None = None) -> bytes:
    """A bundle of ``tip`` and what it reaches, less what ``exclude`` reaches (a thin bundle
    the receiver can read only with ``exclude``)."""
    header = SIGNATURE
    revs = f"{tip}\n"
    if exclude is not None:
        header += f"-{exclude}\n".encode()
        revs += f"^{exclude}\n"
    header += f"{tip} {BUNDLE_REF}\n\n".encode()
    options = ["--thin"] if exclude is not None else []
    packed = Git(repo).run(
        "pack-objects", "--stdout", "--revs", "--quiet", *options, input=revs.encode()
    )
    return header + packed.stdout


def write_bundle(repo: Path, tip: str, dest: Path, *, exclude: str | None = None) -> int:
    """`bundle_bytes` written to ``dest``; its size in bytes."""
    data = bundle_bytes(repo, tip, exclude=exclude)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".part")
    partial.write_bytes(data)
    partial.replace(dest)  # a reader never sees half a bundle
    return len(data)


def base_bundle(repo: Path, base: str, cache: Path) -> Path:
    """The bundle of the base commit (all it reaches) in ``cache``, made once per commit."""
    path = cache / f"{base}.bundle"
    if not path.is_file():
        write_bundle(repo, base, path)
    return path


def read_header(bundle: Path) -> Header:
    """The bundle's header; BundleRefused when it is not a v2 bundle's."""
    with bundle.open("rb") as handle:
        return _header(handle.read(MAX_HEADER))


def _header(head: bytes) -> Header:
    end = head.find(b"\n\n", 0, MAX_HEADER)
    if not head.startswith(SIGNATURE) or end < 0:
        raise BundleRefused("The node's bundle is not a git bundle of worker-bridge's (v2).")
    prerequisites: list[str] = []
    refs: list[tuple[str, str]] = []
    for line in head[len(SIGNATURE) : end].split(b"\n"):
        if line.startswith(b"-"):
            sha = line[1:].split(b" ", 1)[0]
            if not _SHA.match(sha):
                raise BundleRefused("The node's bundle names a prerequisite that is not a commit.")
            prerequisites.append(sha.decode())
            continue
        sha, _, name = line.partition(b" ")
        if not _SHA.match(sha) or not name:
            raise BundleRefused("The node's bundle has a header line that is not a ref.")
        refs.append((sha.decode(), name.decode("utf-8", "replace")))
    return Header(tuple(prerequisites), tuple(refs), end + 2)


def unbundle(repo: Path, data: bytes, ref: str) -> str:
    """A bundle the control host made (trusted: it is this host's own view of the repository)
    taken into ``repo``, its commit kept by ``ref`` + the commit; the commit. By `git
    index-pack` straight into the repository's objects: a fetch from the bundle would walk
    every object it brought once more to check what its sender already guaranteed."""
    header = _header(data)
    if len(header.refs) != 1:
        raise BundleRefused("The control host's bundle must name one commit.")
    tip = header.refs[0][0]
    Git(repo).run("index-pack", "--stdin", "--fix-thin", input=data[header.size :])
    Git(repo).run("update-ref", f"{ref}{tip}", tip)
    return tip


def receive_snapshot(
    repo: Path,
    bundle: Path,
    base: str,
    branch: str,
    limits: SnapshotLimits,
    scratch: Path,
) -> str:
    """The snapshot commit a node sent as ``bundle`` (thin against ``base``), checked and
    written to ``branch`` (refs/heads/...) of ``repo``; BundleRefused, with nothing written to
    the repository, when it is not one the host would have made. ``scratch``: a folder of
    this task's for the quarantine (removed after)."""
    size = bundle.stat().st_size
    if size > limits.change_bytes + PACK_SLACK:
        raise BundleRefused(
            f"The node's snapshot bundle is {size} bytes, over the task's change limit "
            f"({limits.change_bytes} bytes); it was not taken."
        )
    header = read_header(bundle)
    if header.prerequisites != (base,) or len(header.refs) != 1:
        raise BundleRefused(
            "The node's snapshot bundle must hold one commit on top of the task's base and "
            f"need nothing else; it needs {list(header.prerequisites)} and holds "
            f"{len(header.refs)} ref(s)."
        )
    tip, name = header.refs[0]
    if name != BUNDLE_REF:
        raise BundleRefused(f"The node's snapshot bundle names the ref '{name[:80]}', not ours.")
    quarantine = scratch / "quarantine.git"
    shutil.rmtree(quarantine, ignore_errors=True)
    try:
        objects = Path(Git(repo).out("rev-parse", "--path-format=absolute", "--git-common-dir"))
        objects /= "objects"
        sent = _unpack(objects, bundle, header.size, quarantine, limits)
        git = Git(quarantine)
        _check(git, tip, base, limits)
        _check_sent(git, tip, base, sent)
        _adopt(quarantine, objects)
        try:
            Git(repo).run("update-ref", branch, tip)
        except GitError as exc:
            raise BundleRefused(f"The node's snapshot could not be taken ({exc.message}).") from exc
    finally:
        shutil.rmtree(quarantine, ignore_errors=True)
    return tip


def _adopt(quarantine: Path, objects: Path) -> None:
    """The quarantine's pack, checked, moved into the repository's ``objects`` as git's own
    receive-pack moves its quarantine's: index-pack wrote it complete (`--fix-thin`) and
    `_check_sent` found in it exactly the objects the snapshot holds beyond the base (and the
    base's it borrowed), what a fetch of the snapshot would have stored, without a fetch's
    second pass over it. Each file written whole (synced, read-only as the umask allows)
    before it gets its name; the index last: git finds a pack by its index."""
    (packed,) = (quarantine / "objects" / "pack").glob("pack-*.idx")
    folder = objects / "pack"
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in (".pack", ".rev", ".idx"):
        source = packed.with_suffix(suffix)
        if not source.exists() or (folder / source.name).exists():
            continue  # no reverse index written; or the same pack is there already, by its name
        partial = folder / f"tmp_pack_{secrets.token_hex(8)}"  # git's own prefix for these
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)  # less the umask
        try:
            with source.open("rb") as reading, os.fdopen(fd, "wb") as writing:
                shutil.copyfileobj(reading, writing)
                writing.flush()
                os.fsync(writing.fileno())
            partial.replace(folder / source.name)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise


def _unpack(
    objects: Path, bundle: Path, offset: int, quarantine: Path, limits: SnapshotLimits
) -> int:
    """The bundle's pack into ``quarantine``, a bare repository that reads the user's
    ``objects`` (its alternates) and writes its own, by `git index-pack --strict` (git's fsck:
    a `.git` or `..` entry, duplicates, bad modes refuse it) with a bounded object count,
    address space and time (a few KB that inflate to gigabytes stop there)."""
    quarantine.parent.mkdir(parents=True, exist_ok=True)
    Git(quarantine.parent).run("init", "--quiet", "--bare", str(quarantine))
    (quarantine / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    with bundle.open("rb", buffering=0) as pack:
        pack.seek(offset)
        head = pack.read(12)
        if len(head) < 12 or head[:4] != b"PACK" or int.from_bytes(head[4:8], "big") not in (2, 3):
            raise BundleRefused("The node's snapshot bundle holds no git pack after its header.")
        count = int.from_bytes(head[8:12], "big")
        if count > MAX_OBJECTS_PER_ENTRY * limits.entries + PACK_OBJECTS_SLACK:
            raise BundleRefused(
                f"The node's snapshot bundle holds {count} objects, more than a change within "
                f"the task's limit of {limits.entries} files can."
            )
        pack.seek(offset)
        try:
            Git(quarantine).run(
                "index-pack",
                "--strict",
                "--fix-thin",
                "--stdin",
                stdin=pack,
                timeout=RECEIVE_TIMEOUT_S,
                memory_bytes=limits.change_bytes + INDEX_MEMORY,
            )
        except GitError as exc:
            lines = exc.stderr.splitlines()
            said = next((line for line in lines if line.startswith("error:")), lines[-1:] or "")
            raise BundleRefused(
                "The node's snapshot bundle does not unpack as git would write it "
                f"({str(said).removeprefix('error: ')[:200]})."
            ) from exc
    return count


def _check(git: Git, tip: str, base: str, limits: SnapshotLimits) -> None:
    """BundleRefused unless ``tip`` is a snapshot collect would have made on ``base``."""
    found = git.object_info(tip)
    if found is None or found[1] != "commit":
        raise BundleRefused("The node's snapshot bundle's ref does not name a commit.")
    if found[2] > MAX_COMMIT_BYTES:
        raise BundleRefused("The node's snapshot commit is larger than a snapshot's can be.")
    commit = git.run("cat-file", "commit", tip).stdout
    parents = re.findall(rb"(?m)^parent ([0-9a-f]+)$", commit.split(b"\n\n", 1)[0])
    if parents != [base.encode()]:
        raise BundleRefused("The node's snapshot commit does not have the task's base as parent.")
    entries = _count_entries(git, tip, limits.entries)
    if entries > limits.entries:
        raise BundleRefused(
            f"The node's snapshot has more than {limits.entries} files, the task's limit."
        )
    raw = git.run("diff-tree", "-r", "-z", "--no-renames", base, tip).stdout.split(b"\0")
    blobs: list[tuple[str, int]] = []
    for meta, path in zip(raw[0::2], raw[1::2], strict=False):
        if not meta.startswith(b":"):
            continue
        old_mode, new_mode, _, new_sha, status = meta[1:].decode().split(" ")
        _check_path(path)
        if "160000" in (old_mode, new_mode):  # collect never touches a submodule
            raise BundleRefused(
                f"The node's snapshot changes '{_shown(path)}', a submodule (mode 160000), "
                "which a snapshot never does."
            )
        if status == "D":
            continue
        if new_mode not in ALLOWED_MODES:
            raise BundleRefused(
                f"The node's snapshot sets '{_shown(path)}' to mode {new_mode}, which a snapshot "
                "never records."
            )
        if new_mode == "120000" and is_git_file_name(_shown(path).rsplit("/", 1)[-1]):
            raise BundleRefused(
                f"The node's snapshot makes '{_shown(path)}' a symlink, which git would follow "
                "out of the tree and a snapshot never records."
            )
        bound = MAX_LINK_BYTES if new_mode == "120000" else limits.file_bytes
        blobs.append((new_sha, bound))
    _check_sizes(git, blobs, limits)
    # git's own test of every path in the tree (`..`, `.git`, names no checkout could write).
    index = git.cwd / "check.index"
    checked = git.run("read-tree", tip, env={"GIT_INDEX_FILE": str(index)}, check=False)
    if checked.returncode != 0:
        said = checked.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise BundleRefused(f"The node's snapshot holds a path git refuses ({said[0][:160]}).")


def _check_sent(git: Git, tip: str, base: str, sent: int) -> None:
    """BundleRefused unless the bundle brought exactly the objects the snapshot holds beyond
    the base (the first ``sent`` objects of the pack; `--fix-thin` appends the base's objects
    it borrowed after them), as git's own bundle of it would: the quarantine reads all the
    user's objects, and a node must not name one it was never sent (a blob of a private
    branch, known by its id), nor slip in one the snapshot does not use (its pack moves into
    the user's repository whole, where no limit of the task's would ever look at it)."""
    index = next((git.cwd / "objects" / "pack").glob("*.idx"))
    with index.open("rb") as handle:
        listed = git.run("show-index", stdin=handle).stdout.decode().split("\n")
    entries = sorted((int(line.split()[0]), line.split()[1]) for line in listed if line.strip())
    came = {sha for _, sha in entries[:sent]}
    # Each line is an object's id and, for a blob or tree, its path: bytes, maybe not UTF-8.
    lines = git.run("rev-list", "--objects", tip, "--not", base).stdout.split(b"\n")
    needed = {line.split(b" ", 1)[0].decode("ascii") for line in lines} - {""}
    missing = sorted(needed - came)
    if missing:
        raise BundleRefused(
            f"The node's snapshot names object {missing[0][:12]}, which its bundle did not "
            "bring and the base does not reach; it was not taken."
        )
    if came - needed:
        raise BundleRefused(
            f"The node's snapshot bundle brings {len(came - needed)} object(s) its snapshot "
            "does not use; it was not taken."
        )


def _count_entries(git: Git, tip: str, most: int) -> int:
    """The tree's files, counted as `ls-tree -r` streams them; past ``most`` it is stopped (a
    tree of a few hundred bytes can name millions of paths)."""
    proc = git.popen("ls-tree", "-r", "-z", "--name-only", tip, stdout=True)
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdin.close()
    count = 0
    try:
        while chunk := proc.stdout.read(CHUNK):
            count += chunk.count(b"\0")
            if count > most:
                break
    finally:
        proc.kill()
        proc.wait()
    return count


def _check_sizes(git: Git, blobs: list[tuple[str, int]], limits: SnapshotLimits) -> None:
    total = 0
    if blobs:
        listed = "\n".join(sha for sha, _ in blobs).encode()
        sizes = git.run("cat-file", "--batch-check=%(objectsize)", input=listed).stdout.split()
        for (_, bound), size in zip(blobs, map(int, sizes), strict=True):
            if size > bound:
                raise BundleRefused(
                    f"The node's snapshot holds a file or link of {size} bytes, over its limit "
                    f"({bound} bytes)."
                )
            total += size
    if total > limits.change_bytes:
        raise BundleRefused(
            f"The node's snapshot changes {total} bytes, over the task's change limit "
            f"({limits.change_bytes} bytes)."
        )


def _check_path(path: bytes) -> None:
    if len(path) > MAX_PATH_BYTES:
        raise BundleRefused(f"The node's snapshot holds a path over {MAX_PATH_BYTES} bytes.")
    for part in path.decode("utf-8", "surrogateescape").split("/"):
        if part in ("", ".", "..") or is_git_dir_name(part):
            raise BundleRefused(
                f"The node's snapshot holds '{_shown(path)}', a path outside the worktree or "
                "inside git metadata."
            )


def _shown(path: bytes) -> str:
    return path.decode("utf-8", "backslashreplace")[:200]
