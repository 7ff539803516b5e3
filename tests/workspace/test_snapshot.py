"""The snapshot: from a stat baseline it equals the snapshot without one and git's own
`git add --all`, for every kind of change; and it holds against what a hostile worker leaves in
the worktree (FIFOs, nested .git, links out of the worktree, odd names, oversized files)."""

from __future__ import annotations

import os
import subprocess

import pytest
from support.repos import commit_all, git

from bridge.errors import DiskFull
from bridge.workspace.baseline import record_files, touched_paths
from bridge.workspace.git import Git
from bridge.workspace.snapshot import SnapshotLimits, snapshot_worktree
from bridge.workspace.worktree import TaskWorkspace, create_workspace

LIMITS = SnapshotLimits(file_bytes=2**20, change_bytes=4 * 2**20)


def _workspace(home, repo, task_id):
    ws = TaskWorkspace.plan(home, repo, task_id)
    base = Git(repo).resolve_commit("HEAD")
    create_workspace(home, ws, base, None)
    return ws, base


def _snap(ws, base, baseline=None, limits=LIMITS):
    return snapshot_worktree(ws, base, base, "m", limits, baseline)


def _tree(repo, commit):
    return git(repo, "rev-parse", f"{commit}^{{tree}}").strip()


def _edit(root):
    """Every kind of change a worker might make, right after checkout (same second)."""
    calc = root / "calc.py"
    calc.write_text(calc.read_text().replace("a + b", "b + a"))  # same size, same second
    (root / "README.md").unlink()
    (root / "tests" / "test_calc.py").rename(root / "tests" / "test_moved.py")
    (root / "new dir").mkdir()
    (root / "new dir" / "ünï\ncode.txt").write_text("x\n")
    (root / "build.log").write_text("ignored\n")
    os.symlink("calc.py", root / "alias.py")
    os.chmod(root / ".gitignore", 0o755)


def test_a_stat_baseline_snapshot_equals_one_without_and_a_full_git_add(home, repo, workdir):
    fast, base = _workspace(home, repo, "fast")
    full, _ = _workspace(home, repo, "full")
    before = record_files(fast.worktree)
    _edit(fast.worktree)
    _edit(full.worktree)
    touched = touched_paths(before, record_files(fast.worktree))
    assert "calc.py" in touched and "build.log" in touched
    fast_snap = _snap(fast, base, before)
    full_snap = _snap(full, base)
    assert _tree(repo, fast_snap.commit) == _tree(repo, full_snap.commit)
    assert git(repo, "rev-list", "--parents", "-n1", fast_snap.commit).split()[1] == base

    clone = workdir / "by-git"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    _edit(clone)
    git(clone, "add", "--all")
    assert git(clone, "write-tree").strip() == _tree(repo, fast_snap.commit)
    names = git(repo, "diff", "--name-only", "-z", base, fast_snap.commit).split("\0")
    assert "calc.py" in names and "build.log" not in names and "new dir/ünï\ncode.txt" in names


def test_an_untouched_worktree_snapshots_to_the_base_tree(home, repo):
    ws, base = _workspace(home, repo, "same")
    before = record_files(ws.worktree)
    assert touched_paths(before, record_files(ws.worktree)) == []
    assert _tree(repo, _snap(ws, base, before).commit) == _tree(repo, base)
    assert _tree(repo, _snap(ws, base).commit) == _tree(repo, base)


def test_a_rewrite_with_the_same_content_size_and_mtime_is_still_seen(home, repo):
    ws, base = _workspace(home, repo, "touch")
    target = ws.worktree / "calc.py"
    before = record_files(ws.worktree)
    stat = target.stat()
    target.write_text(target.read_text().replace("a + b", "a - b"))
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # hide the mtime change
    assert touched_paths(before, record_files(ws.worktree)) == ["calc.py"]  # ctime tells


def test_the_worktree_is_a_byte_exact_checkout_whatever_the_attributes_say(home, repo):
    (repo / ".gitattributes").write_text("*.txt ident\n*.crlf text eol=crlf\n")
    (repo / "id.txt").write_text("$Id$\n")
    (repo / "lines.crlf").write_text("a\nb\n")
    commit_all(repo, "attributes")
    ws, base = _workspace(home, repo, "raw")
    assert (ws.worktree / "id.txt").read_bytes() == b"$Id$\n"
    assert (ws.worktree / "lines.crlf").read_bytes() == b"a\nb\n"
    assert git(ws.worktree, "status", "--porcelain") == ""


# -- what a hostile worker leaves ---------------------------------------------------------------


def test_fifos_nested_git_and_submodule_tricks_are_dropped_and_reported(home, repo):
    ws, base = _workspace(home, repo, "hostile")
    before = record_files(ws.worktree)
    root = ws.worktree
    os.mkfifo(root / "pipe")
    os.mkfifo(root / ".gitignore.new")
    (root / "embedded").mkdir()
    subprocess.run(["git", "init", "-q", str(root / "embedded")], check=True)
    (root / "embedded" / "code.py").write_text("x = 1\n")
    (root / "linked").mkdir()
    (root / "linked" / ".git").write_text(f"gitdir: {repo / '.git'}\n")  # points at the host
    (root / "linked" / "f.txt").write_text("f\n")
    os.symlink("/etc", root / ".GIT")
    snap = _snap(ws, base, before)
    dropped = {d.path: d.reason for d in snap.dropped}
    assert set(dropped) == {"pipe", ".gitignore.new", "embedded/.git", "linked/.git", ".GIT"}
    assert not os.path.lexists(root / "pipe") and not (root / "embedded" / ".git").exists()
    listed = git(repo, "ls-tree", "-r", "--name-only", snap.commit).split("\n")
    assert "embedded/code.py" in listed and "linked/f.txt" in listed
    assert not [p for p in listed if ".git/" in p.lower() or p.lower().endswith(".git")]


def test_a_directory_replaced_by_a_link_out_of_the_worktree_is_a_link_not_a_way_out(home, repo):
    ws, base = _workspace(home, repo, "escape")
    before = record_files(ws.worktree)
    (ws.worktree / "tests" / "test_calc.py").unlink()
    (ws.worktree / "tests").rmdir()
    os.symlink("/etc", ws.worktree / "tests")
    (ws.worktree / "calc.py").unlink()
    (ws.worktree / "calc.py").mkdir()  # a file replaced by a directory
    (ws.worktree / "calc.py" / "inner.py").write_text("y\n")
    snap = _snap(ws, base, before)
    entries = git(repo, "ls-tree", "-r", snap.commit)
    assert "120000 blob" in entries.split("tests")[0].splitlines()[-1]
    assert git(repo, "cat-file", "blob", f"{snap.commit}:tests") == "/etc"
    assert git(repo, "show", f"{snap.commit}:calc.py/inner.py") == "y\n"
    assert "passwd" not in entries


def test_names_that_are_not_utf8_and_quotes_and_newlines_survive(home, repo):
    ws, base = _workspace(home, repo, "names")
    before = record_files(ws.worktree)
    odd = os.fsencode(ws.worktree) + b'/caf\xe9 "q"\\x\nl.txt'
    with open(odd, "wb") as fh:
        fh.write(b"latin-1 name\n")
    snap = _snap(ws, base, before)
    raw = Git(repo).run("ls-tree", "-z", "--name-only", snap.commit).stdout.split(b"\0")
    assert b'caf\xe9 "q"\\x\nl.txt' in raw


def test_a_file_over_the_limit_fails_before_anything_is_written_to_the_object_store(home, repo):
    ws, base = _workspace(home, repo, "big")
    before = record_files(ws.worktree)
    (ws.worktree / "big.bin").write_bytes(b"\0" * (2 * 2**20))
    objects_before = git(repo, "count-objects", "-v")
    with pytest.raises(DiskFull, match="big.bin.*limits.file_mb"):
        _snap(ws, base, before)
    many = SnapshotLimits(file_bytes=4 * 2**20, change_bytes=2**20)
    with pytest.raises(DiskFull, match="limits.change_mb"):
        _snap(ws, base, before, many)
    assert git(repo, "count-objects", "-v") == objects_before
    assert git(repo, "rev-parse", ws.branch).strip() == base  # the branch did not move


def test_names_git_would_refuse_and_pathspec_lookalikes_are_handled(home, repo):
    ws, base = _workspace(home, repo, "names2")
    before = record_files(ws.worktree)
    root = ws.worktree
    (root / ":(glob)x").write_text("looks like pathspec magic\n")
    (root / ":!y").write_text("so does this\n")
    for name in (".git.", ".GIT ", "git~1", "git~1:x", ".git :z", ".GIT.:s"):
        (root / name).mkdir()
        (root / name / "config").write_text("[core]\n")
    os.symlink("/etc/passwd", root / ".gitmodules")
    snap = _snap(ws, base, before)
    dropped = {d.path for d in snap.dropped}
    assert {".git.", ".GIT ", "git~1", "git~1:x", ".git :z", ".GIT.:s", ".gitmodules"} <= dropped
    listed = git(repo, "ls-tree", "-r", "--name-only", snap.commit).split("\n")
    assert ":(glob)x" in listed and ":!y" in listed
    # The snapshot checks out: git itself finds nothing to refuse in it.
    git(repo, "read-tree", "--index-output=" + str(home / "check.index"), snap.commit)


def test_the_diff_keeps_its_prefixes_whatever_the_users_git_config_says(
    home, repo, workdir, monkeypatch
):
    from bridge.workspace.diff import write_diff

    config = workdir / "gitconfig"
    config.write_text("[diff]\n\tnoprefix = true\n\tmnemonicPrefix = true\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    ws, base = _workspace(home, repo, "prefix")
    before = record_files(ws.worktree)
    (ws.worktree / "calc.py").write_text("changed\n")
    snap = _snap(ws, base, before)
    write_diff(repo, base, snap.commit, workdir / "d.diff")
    text = (workdir / "d.diff").read_text()
    assert "--- a/calc.py" in text and "+++ b/calc.py" in text


def test_too_many_files_fail_with_the_limit_named(home, repo):
    ws, base = _workspace(home, repo, "many")
    before = record_files(ws.worktree)
    for i in range(120):
        (ws.worktree / f"f{i}").write_text("x")
    small = SnapshotLimits(file_bytes=2**20, change_bytes=2**20, entries=100)
    with pytest.raises(DiskFull, match="limits.files"):
        _snap(ws, base, before, small)


def test_a_tree_too_deep_to_measure_counts_as_over_the_limit(workdir):
    from bridge.workspace import fs

    root = workdir / "deep"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    for _ in range(fs.MAX_DEPTH + 5):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    with pytest.raises(fs.TreeTooDeep):
        fs.tree_size([root])
    assert fs.remove_tree(root) == [] and not root.exists()


def test_git_z_fields_decode_in_one_call_as_each_name_would_alone():
    from bridge.workspace import fs

    names = [
        b"plain.txt",
        "caf\u00e9/\u65e5\u672c.md".encode(),
        b"bad\xff\xfe.bin",
        b"cut\xe2\x82",
        b"new\nline",
        b"\xe2\x82\xac-euro",
        b"",
    ]
    fields = fs.decode_fields(b"\0".join(names))
    assert fields == [fs.decode(n) for n in names]
    assert [fs.encode(f) for f in fields] == names  # each name back byte for byte
    assert [fs.display(f) for f in fields] == [n.decode("utf-8", "backslashreplace") for n in names]


def _listing(root) -> dict[bytes, tuple]:
    """Every entry under ``root``: its kind, executable bit and bytes or link target."""
    found = {}
    top = os.fsencode(root)
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, top)
            if os.path.islink(path):
                found[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                found[rel] = ("dir",)
            else:
                with open(path, "rb") as fh:
                    found[rel] = ("file", os.stat(path).st_mode & 0o111 != 0, fh.read())
    return found


def test_a_base_checkout_brought_to_the_snapshot_by_its_changes_alone_is_the_snapshot(
    home, repo, workdir
):
    """Verification's prepared checkout is the base plus only the changed paths, each written
    from the mode and blob `git diff --raw` gives: for every kind of change it must equal a
    full checkout of the snapshot, entry for entry."""
    from bridge.workspace.diff import export_snapshot, list_changes, update_checkout

    (repo / "swap").write_text("a file that becomes a folder\n")
    (repo / "gone").mkdir()
    (repo / "gone" / "a.txt").write_text("a folder that becomes a file\n")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    os.symlink("calc.py", repo / "link.py")
    commit_all(repo, "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    _edit(repo)
    (repo / "swap").unlink()
    (repo / "swap").mkdir()
    (repo / "swap" / "inside.txt").write_text("now a folder\n")
    (repo / "gone" / "a.txt").unlink()
    (repo / "gone").rmdir()
    (repo / "gone").write_text("now a file\n")
    (repo / "run.sh").chmod(0o644)
    (repo / "link.py").unlink()
    (repo / "link.py").write_text("a link that became a file\n")
    with open(os.fsencode(repo) + b"/caf\xe9\nx.txt", "wb") as fh:
        fh.write(b"a name that is not UTF-8\n")
    (repo / ":(glob)*").write_text("looks like pathspec magic\n")
    (repo / "-n").write_text("looks like an option\n")
    (repo / "tool").write_text("new and executable\n")
    (repo / "tool").chmod(0o755)
    commit_all(repo, "snapshot")
    snapshot = git(repo, "rev-parse", "HEAD").strip()

    changes = list_changes(repo, base, snapshot)
    kinds = {c.change for c in changes}
    assert {"added", "modified", "deleted", "renamed", "type_changed"} <= kinds
    updated, full = workdir / "updated", workdir / "full"
    export_snapshot(home, repo, base, updated, workdir)
    written = update_checkout(home, repo, updated, changes, workdir)
    export_snapshot(home, repo, snapshot, full, workdir)
    assert _listing(updated) == _listing(full)
    assert sorted(written) == sorted(c.path for c in changes if c.change != "deleted")
    assert not list(workdir.glob("checkout-*.index"))  # the temporary index is gone


def test_a_changed_path_git_refuses_to_check_out_fails_the_update_instead_of_vanishing(
    home, repo, workdir
):
    """A tree can hold a name git's checkout refuses (`git~1:x`, the short name of `.git` on
    some filesystems, then a colon): `update-index --index-info` leaves such an entry out with a
    warning and exit 0. Verification's checkout must then fail, as a full checkout of the tree
    does, never check a tree without that file."""
    from bridge.errors import GitError
    from bridge.workspace.diff import export_snapshot, list_changes, update_checkout

    base = git(repo, "rev-parse", "HEAD").strip()
    stream = (
        "commit refs/heads/odd\n"
        "committer t <t@example.com> 0 +0000\n"
        "data 4\nodd\n"
        f"from {base}\n"
        "M 100644 inline git~1:x/f\ndata 6\nhello\n"
        "M 100644 inline ok.txt\ndata 3\nok\n\n"
    )
    subprocess.run(
        ["git", "-C", str(repo), "fast-import", "--quiet"], input=stream.encode(), check=True
    )
    snapshot = git(repo, "rev-parse", "refs/heads/odd").strip()
    changes = list_changes(repo, base, snapshot)
    assert {c.path for c in changes} == {"git~1:x/f", "ok.txt"}
    with pytest.raises(GitError):
        export_snapshot(home, repo, snapshot, workdir / "full", workdir)  # as git refuses it
    updated = workdir / "updated"
    export_snapshot(home, repo, base, updated, workdir)
    with pytest.raises(GitError, match="left entries out"):
        update_checkout(home, repo, updated, changes, workdir)
