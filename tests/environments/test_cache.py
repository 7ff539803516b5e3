"""The environment's pure parts, without an engine: what keys the cache, which dependency files
count, what a snapshot's setup may reach, how cached files are put into a tree, and what the
cache's check notices."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from bridge.environments.cache import (
    ENTRY_FILE,
    OUTPUTS,
    load_entry,
    materialize,
    seal,
    setup_key,
    shared_view,
)
from bridge.environments.definition import EnvDefinition, key_files
from bridge.environments.devcontainer import DevcontainerBuild
from bridge.environments.digest import FilesCheck, tree_digest
from bridge.environments.setup import _task_allows
from bridge.models import Network


def _definition(**extra) -> EnvDefinition:
    fields = {
        "image": "img",
        "build": None,
        "devcontainer": None,
        "setup": ("npm ci",),
        "setup_network": ("registry.npmjs.org", "*.pythonhosted.org"),
    }
    fields.update(extra)
    return EnvDefinition(**fields)


def test_the_key_changes_with_each_input_and_only_with_them():
    base = dict(
        image_id="sha256:a",
        commands=("npm ci",),
        container_env={},
        setup_network=(),
        files={"package-lock.json": "b1"},
        repository="/r",
    )

    def key(**change) -> str:
        args = {**base, **change}
        repository = args.pop("repository")
        return setup_key(**args, repository=repository)

    assert key() == key()
    assert (
        len(
            {
                key(),
                key(image_id="sha256:b"),
                key(commands=("npm i",)),
                key(container_env={"A": "1"}),
                key(setup_network=("x.org",)),
                key(files={"package-lock.json": "b2"}),
                key(repository="/fork"),
            }
        )
        == 7
    )


def test_dependency_files_are_found_by_name_at_any_depth_or_by_the_given_globs():
    tree = {
        "package.json": "1",
        "web/package-lock.json": "2",
        "src/index.js": "3",
        "requirements-dev.txt": "4",
        "docs/requirements.md": "5",
        "scripts/post.sh": "6",
    }
    assert sorted(key_files(_definition(), tree)) == [
        "package.json",
        "requirements-dev.txt",
        "web/package-lock.json",
    ]
    chosen = key_files(_definition(cache_key_files=("package.json", "scripts/*")), tree)
    assert sorted(chosen) == ["package.json", "scripts/post.sh"]


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"cache_key_files": ("tools/*.cfg", "keep.txt")},
        {"build": DevcontainerBuild(".devcontainer/Dockerfile", ".", {}, None)},
    ],
    ids=["by-name", "globs", "dockerfile"],
)
def test_a_snapshots_dependency_files_follow_from_the_base_and_the_changes_alone(tmp_path, extra):
    """Verification learns whether the worker changed a dependency file from the change set
    (no second listing of the whole tree): for every kind of change it must give what listing
    the snapshot's tree gives."""
    from support.repos import commit_all, git, write_files

    from bridge.environments.definition import key_files_after, tree_files
    from bridge.workspace.diff import list_changes
    from bridge.workspace.git import Git

    repo = tmp_path / "repo"
    files = {
        "package.json": "{}",
        "web/package-lock.json": "{}",
        "requirements.txt": "a\n",
        "old/yarn.lock": "y\n",
        "tools/x.cfg": "1\n",
        "keep.txt": "k\n",
        "linked/Cargo.toml": "[package]\n",
        ".devcontainer/Dockerfile": "FROM x\n",
        "src/main.py": "print()\n",
    }
    write_files(repo, files)
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    commit_all(repo, "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "package.json").write_text('{"name": "changed"}')  # modified
    (repo / "web" / "package-lock.json").unlink()  # deleted
    (repo / "requirements.txt").rename(repo / "requirements-dev.txt")  # renamed, still a key
    (repo / "old" / "yarn.lock").rename(repo / "old" / "notes.txt")  # renamed away
    (repo / "tools" / "x.cfg").write_text("2\n")
    (repo / "tools" / "y.cfg").write_text("3\n")  # added
    (repo / "keep.txt").unlink()
    os.symlink("src/main.py", repo / "keep.txt")  # a file that became a link: not a key
    (repo / "linked" / "Cargo.toml").unlink()
    (repo / "linked" / "Cargo.toml").mkdir()  # a file that became a folder
    (repo / "linked" / "Cargo.toml" / "go.mod").write_text("module x\n")
    (repo / ".devcontainer" / "Dockerfile").write_text("FROM y\n")
    (repo / "src" / "main.py").write_text("print(1)\n")
    commit_all(repo, "snapshot")
    snapshot = git(repo, "rev-parse", "HEAD").strip()

    definition = _definition(**extra)
    g = Git(repo)
    before = key_files(definition, tree_files(g, base))
    expected = key_files(definition, tree_files(g, snapshot))
    assert expected != before
    changes = list_changes(repo, base, snapshot)
    assert key_files_after(definition, before, changes) == expected


def test_a_snapshot_setup_reaches_only_what_the_task_itself_may():
    def allows(network: Network):
        return _task_allows(SimpleNamespace(spec=SimpleNamespace(network=network)), _definition())

    assert allows(Network()) == ()
    assert allows(Network(mode="allowlist", domains=["example.com"])) == ()
    assert allows(Network(mode="allowlist", domains=["*.npmjs.org"])) == ("registry.npmjs.org",)
    # A pattern of setup_network is kept only when the task names the same pattern.
    assert allows(Network(mode="allowlist", domains=["*.pythonhosted.org"])) == (
        "*.pythonhosted.org",
    )


def test_cached_files_are_linked_in_and_what_the_tree_holds_wins(tmp_path):
    outputs, dest = tmp_path / "outputs", tmp_path / "dest"
    (outputs / "node_modules" / "a").mkdir(parents=True)
    (outputs / "node_modules" / "a" / "index.js").write_text("cached\n")
    (outputs / "node_modules" / "a" / "link").symlink_to("/etc/passwd")
    (outputs / "build.txt").mkdir()  # the tree holds a file there: the folder is skipped
    (outputs / "build.txt" / "inner").write_text("x")
    seal(outputs)
    (dest / "node_modules" / "a").mkdir(parents=True)
    (dest / "node_modules" / "a" / "index.js").write_text("tracked\n")
    (dest / "build.txt").write_text("mine\n")
    owner = (os.getuid(), os.getgid()) if os.geteuid() == 0 else None
    materialize(outputs, dest, owner)
    assert (dest / "node_modules" / "a" / "index.js").read_text() == "tracked\n"
    assert os.readlink(dest / "node_modules" / "a" / "link") == "/etc/passwd"
    assert (dest / "build.txt").read_text() == "mine\n"
    (tmp_path / "fresh").mkdir()
    materialize(outputs, tmp_path / "fresh", owner)
    linked = tmp_path / "fresh" / "node_modules" / "a" / "index.js"
    assert linked.read_text() == "cached\n"
    assert linked.stat().st_mode & 0o222 == 0  # sealed: read-only for everyone
    if owner is not None:  # a hard link to the cache's inode, never a copy
        assert linked.stat().st_ino == (outputs / "node_modules" / "a" / "index.js").stat().st_ino


def test_the_digest_notices_names_modes_sizes_mtimes_and_links(tmp_path):
    root = tmp_path / "t"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("abc")
    (root / "l").symlink_to("d/f")
    before, files, size = tree_digest(root)
    assert (files, size) == (2, 3 + len("d/f"))
    (root / "d" / "f").write_text("abd")  # same size, new mtime
    assert tree_digest(root)[0] != before
    now = tree_digest(root)[0]
    os.chmod(root / "d" / "f", 0o600)
    assert tree_digest(root)[0] != now
    now = tree_digest(root)[0]
    (root / "l").unlink()
    (root / "l").symlink_to("elsewhere")
    assert tree_digest(root)[0] != now
    now = tree_digest(root)[0]
    os.rename(root / "d" / "f", root / "d" / "g")  # a rename keeps the inode and its mtime
    assert tree_digest(root)[0] != now
    # A name with a newline and bytes that are not UTF-8 is listed as it is.
    odd = os.fsencode(root / "d") + b"/x\n\xff"
    with open(odd, "wb") as f:
        f.write(b"1")
    digest, files, _ = tree_digest(root)
    assert files == 3
    os.rename(odd, os.fsencode(root / "d") + b"/x\n\xfe")
    assert tree_digest(root)[0] != digest


def _entry(folder, content: str):
    """A cache entry made in ``folder`` (again, if one was there), its digest recorded."""
    outputs = folder / OUTPUTS
    (outputs / "node_modules").mkdir(parents=True, exist_ok=True)
    file = outputs / "node_modules" / "index.js"
    file.unlink(missing_ok=True)
    file.write_text(content)
    os.utime(file, ns=(499162500000000000, 499162500000000000))  # npm's fixed mtime
    record = {
        "key": folder.name,
        "image": "img",
        "image_id": "sha256:a",
        "digest": tree_digest(outputs)[0],
        "created_at": "2026-12-03T00:00:00Z",
        "nonce": os.urandom(8).hex(),
    }
    (folder / ENTRY_FILE).write_text(json.dumps(record))
    entry = load_entry(folder)
    assert entry is not None
    return entry


def test_the_files_check_notices_a_change_made_after_the_entry_was_picked(tmp_path):
    entry = _entry(tmp_path / "environments" / "k", "cached\n")
    assert FilesCheck(entry).result() is None
    (entry.outputs / "node_modules" / "index.js").write_text("POISONED\n")
    assert FilesCheck(entry).result() == "its files changed since it was made"
    (entry.outputs / "node_modules" / "index.js").unlink()
    (entry.outputs / "node_modules").rmdir()
    (entry.outputs / "node_modules").symlink_to("/nowhere")
    assert FilesCheck(entry).result() == "its files changed since it was made"
    entry.outputs.rename(entry.folder / "gone")
    assert FilesCheck(entry).result() == "its files could not be read"


def test_waiting_for_the_files_check_gives_up_on_a_cancel(tmp_path, monkeypatch):
    import threading

    import bridge.environments.digest as digest

    entry = _entry(tmp_path / "environments" / "k", "cached\n")
    release = threading.Event()

    def stuck(root, keep=None, *, background=False, started=None):  # a listing that hangs
        release.wait(30)
        return "never"

    monkeypatch.setattr(digest, "_listing_digest", stuck)
    check = FilesCheck(entry)
    calls = []

    def cancelled():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("cancelled")

    try:
        with pytest.raises(RuntimeError, match="cancelled"):
            check.result(cancelled)
    finally:
        release.set()
    assert check.result() == "its files changed since it was made"


def test_a_view_made_from_a_damaged_entry_is_never_the_view_of_the_entry_made_again(tmp_path):
    home, owner = tmp_path / "home", None
    folder = home / "environments" / "k"
    first = _entry(folder, "cached\n")
    # Damaged in place after it was made (same size, same mtime: the digest cannot tell), and a
    # view made from it before its check failed.
    damaged = first.outputs / "node_modules" / "index.js"
    damaged.write_text("POISON\n")
    os.utime(damaged, ns=(499162500000000000, 499162500000000000))
    poisoned = shared_view(home, first.outputs, owner)
    assert (poisoned / "node_modules" / "index.js").read_text() == "POISON\n"
    # Made again by a setup as deterministic as npm's: the same names, sizes and mtimes.
    again = _entry(folder, "cached\n")
    assert again.record["digest"] == first.record["digest"]
    view = shared_view(home, again.outputs, owner)
    assert view != poisoned
    assert (view / "node_modules" / "index.js").read_text() == "cached\n"


def test_the_digest_never_opens_follows_or_stops_on_what_a_setup_planted(tmp_path):
    """A snapshot's setup is the worker's code: a FIFO (a reader would block on it), a link to
    the host's /etc, a tree deeper than PATH_MAX: the listing opens none, follows none, and
    answers."""
    root = tmp_path / "t"
    root.mkdir()
    os.mkfifo(root / "pipe")
    (root / "etc").symlink_to("/etc")
    deep = os.open(root, os.O_RDONLY)
    for _ in range(400):  # 400 * 20 bytes: past PATH_MAX (4096)
        os.mkdir("d" * 19, dir_fd=deep)
        deep, parent = os.open("d" * 19, os.O_RDONLY, dir_fd=deep), deep
        os.close(parent)
    os.close(deep)
    digest, files, size = tree_digest(root)
    assert files == 2 and size == len("/etc")  # the FIFO and the link, never what it names
    os.unlink(root / "etc")
    (root / "etc").symlink_to("/etx")  # same length, another target
    assert tree_digest(root)[0] != digest
    from bridge.workspace.fs import remove_tree

    remove_tree(root)  # (deeper than a path-based removal reaches)


def test_the_tally_counts_records_cut_anywhere_across_chunks():
    from bridge.environments.digest import _Tally

    records = [
        [b"d", b"755", b"0:0", b"4096", b"", b"", b"a"],
        [b"f", b"444", b"0:0", b"12", b"1.5", b"", b"a/x"],
        [b"l", b"777", b"0:0", b"3", b"2.5", b"a/x", b"a/l"],
    ]
    listing = b"".join(field + b"\0" for record in records for field in record)
    for cut in range(1, 8):  # every chunk size: a field, a NUL or a number split in two
        tally = _Tally()
        for i in range(0, len(listing), cut):
            tally.feed(listing[i : i + cut])
        assert (tally.files, tally.size) == (2, 15), cut
