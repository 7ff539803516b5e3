"""The snapshot from a stat baseline must equal the snapshot from a full `git add --all`, for
every kind of change, including ones git's second-granularity stat check could miss."""

from __future__ import annotations

import os

from conftest import git

from bridge.workspace.baseline import record_files, touched_paths
from bridge.workspace.git import Git
from bridge.workspace.worktree import TaskWorkspace, create_workspace, snapshot_worktree


def _workspace(home, repo, task_id):
    ws = TaskWorkspace.plan(home, repo, task_id)
    base = Git(repo).resolve_commit("HEAD")
    create_workspace(home, ws, base, None)
    return ws, base


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


def test_a_stat_baseline_snapshot_equals_a_full_add(home, repo):
    fast, base = _workspace(home, repo, "fast")
    full, _ = _workspace(home, repo, "full")
    before = record_files(fast.worktree)
    _edit(fast.worktree)
    _edit(full.worktree)
    touched = touched_paths(before, record_files(fast.worktree))
    assert "calc.py" in touched and "build.log" in touched
    fast_commit = snapshot_worktree(fast, base, "m", touched)
    full_commit = snapshot_worktree(full, base, "m", None)
    assert git(repo, "rev-parse", f"{fast_commit}^{{tree}}") == git(
        repo, "rev-parse", f"{full_commit}^{{tree}}"
    )
    names = git(repo, "diff", "--name-only", "-z", base, fast_commit).split("\0")
    assert "calc.py" in names and "build.log" not in names and "new dir/ünï\ncode.txt" in names


def test_an_untouched_worktree_snapshots_to_the_base_tree(home, repo):
    ws, base = _workspace(home, repo, "same")
    touched = touched_paths(record_files(ws.worktree), record_files(ws.worktree))
    assert touched == []
    commit = snapshot_worktree(ws, base, "m", touched)
    assert git(repo, "rev-parse", f"{commit}^{{tree}}") == git(
        repo, "rev-parse", f"{base}^{{tree}}"
    )


def test_a_rewrite_with_the_same_content_size_and_mtime_is_still_seen(home, repo):
    ws, base = _workspace(home, repo, "touch")
    target = ws.worktree / "calc.py"
    before = record_files(ws.worktree)
    stat = target.stat()
    target.write_text(target.read_text().replace("a + b", "a - b"))
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # hide the mtime change
    assert touched_paths(before, record_files(ws.worktree)) == ["calc.py"]  # ctime tells
