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
its entry limit. Only then is the commit fetched into the task's branch. Its id is the
snapshot's id: what the host diffs, verifies and accepts is what the node committed.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import BridgeError, GitError
from bridge.workspace.git import Git
from bridge.workspace.snapshot import MAX_PATH_BYTES, SnapshotLimits, is_git_dir_name

SIGNATURE = b"# v2 git bundle\n"
BUNDLE_REF = "refs/worker-bridge/snapshot"
MAX_HEADER = 64 * 1024  # a header is a few lines: more is not a bundle of ours
PACK_SLACK = 1 << 20  # a pack's own bytes over the blobs it holds (headers, trees, the commit)
ALLOWED_MODES = {"100644", "100755", "120000"}
_SHA = re.compile(rb"^[0-9a-f]{40}$")
# fsck as refusal, not warning: what git itself would never write into a tree.
_FSCK = ("-c", "fetch.fsckObjects=true", "-c", "transfer.fsckObjects=true")


class BundleRefused(BridgeError):
    """A bundle a node sent that the control host does not take (one sentence: what was wrong);
    nothing of it is left in the user's repository."""

    kind = "sandbox"


@dataclass(frozen=True)
class Header:
    prerequisites: tuple[str, ...]
    refs: tuple[tuple[str, str], ...]  # (commit, ref name)
    size: int  # bytes up to and including the blank line; the pack follows


def write_bundle(repo: Path, tip: str, dest: Path, *, exclude: str | None = None) -> int:
    """A bundle of ``tip`` and what it reaches, less what ``exclude`` reaches (a thin bundle
    the receiver can read only with ``exclude``), written to ``dest``; its size in bytes."""
    git = Git(repo)
    header = SIGNATURE
    revs = f"{tip}\n"
    if exclude is not None:
        header += f"-{exclude}\n".encode()
        revs += f"^{exclude}\n"
    header += f"{tip} {BUNDLE_REF}\n\n".encode()
    options = ["--thin"] if exclude is not None else []
    packed = git.run("pack-objects", "--stdout", "--revs", "--quiet", *options, input=revs.encode())
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".part")
    partial.write_bytes(header + packed.stdout)
    partial.replace(dest)  # a reader never sees half a bundle
    return len(header) + len(packed.stdout)


def base_bundle(repo: Path, base: str, cache: Path) -> Path:
    """The bundle of the base commit (all it reaches) in ``cache``, made once per commit."""
    path = cache / f"{base}.bundle"
    if not path.is_file():
        write_bundle(repo, base, path)
    return path


def read_header(bundle: Path) -> Header:
    """The bundle's header; BundleRefused when it is not a v2 bundle's."""
    with bundle.open("rb") as handle:
        head = handle.read(MAX_HEADER)
    end = head.find(b"\n\n")
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
        _unpack(repo, bundle, quarantine)
        _check(Git(quarantine), tip, base, limits)
        Git(repo).run(
            "fetch", "--quiet", "--no-tags", str(quarantine), f"+refs/quarantine:{branch}"
        )
    finally:
        shutil.rmtree(quarantine, ignore_errors=True)
    return tip


def _unpack(repo: Path, bundle: Path, quarantine: Path) -> None:
    """The bundle's objects into ``quarantine``, a bare repository that reads the user's
    objects (its alternates) and writes its own: fsck'd, the prerequisite checked by git."""
    quarantine.parent.mkdir(parents=True, exist_ok=True)
    Git(quarantine.parent).run("init", "--quiet", "--bare", str(quarantine))
    objects = Git(repo).out("rev-parse", "--path-format=absolute", "--git-common-dir")
    (quarantine / "objects" / "info" / "alternates").write_text(f"{objects}/objects\n")
    try:
        Git(quarantine).run(
            *_FSCK, "fetch", "--quiet", "--no-tags", str(bundle), f"{BUNDLE_REF}:refs/quarantine"
        )
    except GitError as exc:
        raise BundleRefused(
            f"The node's snapshot bundle does not unpack as git would write it ({exc.message})."
        ) from exc


def _check(git: Git, tip: str, base: str, limits: SnapshotLimits) -> None:
    """BundleRefused unless ``tip`` is a snapshot collect would have made on ``base``."""
    commit = git.run("cat-file", "commit", tip).stdout
    parents = re.findall(rb"(?m)^parent ([0-9a-f]+)$", commit.split(b"\n\n", 1)[0])
    if parents != [base.encode()]:
        raise BundleRefused("The node's snapshot commit does not have the task's base as parent.")
    raw = git.run("diff-tree", "-r", "-z", "--no-renames", base, tip).stdout.split(b"\0")
    blobs: list[str] = []
    for meta, path in zip(raw[0::2], raw[1::2], strict=False):
        if not meta.startswith(b":"):
            continue
        _, new_mode, _, new_sha, status = meta[1:].decode().split(" ")
        _check_path(path)
        if status == "D":
            continue
        if new_mode not in ALLOWED_MODES:
            raise BundleRefused(
                f"The node's snapshot sets '{_shown(path)}' to mode {new_mode}, which a snapshot "
                "never records (a submodule, say)."
            )
        if new_mode != "120000":
            blobs.append(new_sha)
    total = 0
    if blobs:
        sizes = git.run("cat-file", "--batch-check=%(objectsize)", input="\n".join(blobs).encode())
        for size in map(int, sizes.stdout.split()):
            if size > limits.file_bytes:
                raise BundleRefused(
                    f"The node's snapshot holds a file of {size} bytes, over the task's file "
                    f"limit ({limits.file_bytes} bytes)."
                )
            total += size
    if total > limits.change_bytes:
        raise BundleRefused(
            f"The node's snapshot changes {total} bytes, over the task's change limit "
            f"({limits.change_bytes} bytes)."
        )
    entries = git.run("ls-tree", "-r", "-z", "--name-only", tip).stdout.count(b"\0")
    if entries > limits.entries:
        raise BundleRefused(
            f"The node's snapshot has {entries} files, over the task's limit ({limits.entries})."
        )


def _check_path(path: bytes) -> None:
    if len(path) > MAX_PATH_BYTES:
        raise BundleRefused(f"The node's snapshot holds a path over {MAX_PATH_BYTES} bytes.")
    for part in path.decode("utf-8", "surrogateescape").split("/"):
        if is_git_dir_name(part):
            raise BundleRefused(
                f"The node's snapshot holds '{_shown(path)}', a path inside git metadata."
            )


def _shown(path: bytes) -> str:
    return path.decode("utf-8", "backslashreplace")[:200]
