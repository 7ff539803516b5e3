"""Accept's writer on its own (no engine): byte-exact writes, refusals that leave the user's
files alone, and undo that puts everything back, also across filesystems."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from support.repos import git

from bridge.workspace.accept import (
    check_entries,
    check_written,
    dirty_paths,
    target_entries,
    tracked_paths,
)
from bridge.workspace.git import Git
from bridge.workspace.rawgit import raw_git
from bridge.workspace.writer import BlobReader, Refused, Writer


def _change(repo: Path, files: dict[str, str]) -> str:
    """A commit on a side branch with ``files`` changed; returns its sha (HEAD unchanged)."""
    git(repo, "checkout", "-q", "-b", "side")
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A", "--force")
    git(repo, "commit", "-qm", "side")
    sha = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    return sha


def test_an_ignored_file_of_the_users_is_never_written_over(home, repo):
    target = _change(repo, {"calc.py": "changed\n", "app.log": "the worker's\n"})
    (repo / "app.log").write_text("the user's log\n")  # ignored by the repository's .gitignore
    raw = raw_git(home, repo)
    entries = target_entries(raw, target, ["calc.py", "app.log"])
    assert "app.log" not in dirty_paths(repo)  # git status does not show it
    with pytest.raises(Refused, match="not tracked"):
        check_entries(repo, entries, dirty_paths(repo), tracked_paths(repo))
    assert (repo / "app.log").read_text() == "the user's log\n"


def test_undo_puts_every_file_back_even_with_backups_on_another_filesystem(home, repo):
    target = _change(repo, {"calc.py": "new calc\n", "README.md": "new readme\n"})
    before = {n: (repo / n).read_bytes() for n in ("calc.py", "README.md")}
    raw = raw_git(home, repo)
    entries = target_entries(raw, target, ["calc.py", "README.md", "tests/test_calc.py"])
    backup = Path(tempfile.mkdtemp(dir="/tmp")) / "backup"  # /tmp: not the repository's disk
    writer = Writer(repo, backup)
    blobs = BlobReader(raw)
    try:
        writer.apply(entries, blobs)
    finally:
        blobs.close()
    algo = Git(repo).out("rev-parse", "--show-object-format")
    assert check_written(repo, entries, algo, 2**20) is None
    assert (repo / "calc.py").read_text() == "new calc\n"
    writer.undo()
    assert {n: (repo / n).read_bytes() for n in before} == before
    assert (repo / "tests" / "test_calc.py").is_file()
    assert not backup.exists()
    assert git(repo, "status", "--porcelain") == ""


def test_a_written_file_that_differs_from_its_blob_is_caught(home, repo):
    target = _change(repo, {"calc.py": "exact bytes\n"})
    raw = raw_git(home, repo)
    entries = target_entries(raw, target, ["calc.py"])
    (repo / "calc.py").write_text("something else\n")
    algo = Git(repo).out("rev-parse", "--show-object-format")
    assert check_written(repo, entries, algo, 2**20) == "calc.py"
    os.chmod(repo / "calc.py", 0o755)


def _write_all(home: Path, repo: Path, entries, backup: Path) -> Writer:  # noqa: ANN001
    writer = Writer(repo, backup, tracked_paths(repo))
    blobs = BlobReader(raw_git(home, repo))
    try:
        writer.apply(entries, blobs)
    except BaseException:
        writer.undo()
        raise
    finally:
        blobs.close()
    return writer


def test_a_file_that_appears_after_the_checks_is_never_written_over(home, repo, workdir):
    target = _change(repo, {"new/a.txt": "a\n", "new/b.txt": "b\n", "calc.py": "changed\n"})
    entries = target_entries(raw_git(home, repo), target, ["calc.py", "new/a.txt", "new/b.txt"])
    check_entries(repo, entries, dirty_paths(repo), tracked_paths(repo))
    (repo / "new").mkdir()
    (repo / "new" / "b.txt").write_text("the user's, made just now\n")  # after the checks

    with pytest.raises(Refused, match="appeared"):
        _write_all(home, repo, entries, workdir / "backup")

    assert (repo / "new" / "b.txt").read_text() == "the user's, made just now\n"
    assert not (repo / "new" / "a.txt").exists()
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"


def test_a_blob_missing_half_way_through_puts_everything_back(home, repo, workdir):
    files = {f"many/{i}.txt": f"{i}\n" for i in range(300)}
    target = _change(repo, files)
    entries = target_entries(raw_git(home, repo), target, sorted(files))
    broken = entries[150].__class__(entries[150].path, entries[150].mode, "0" * len(entries[0].sha))
    entries[150] = broken

    with pytest.raises(Refused, match="missing"):
        _write_all(home, repo, entries, workdir / "backup")

    assert not (repo / "many").exists()
    assert git(repo, "status", "--porcelain") == ""


def test_folders_a_deletion_empties_are_removed_and_put_back_on_undo(home, repo, workdir):
    for name in ("a/b/c/1.txt", "a/b/c/2.txt", "a/b/3.txt", "a/keep/4.txt"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(name)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "folders")
    gone = ["a/b/c/1.txt", "a/b/c/2.txt", "a/b/3.txt"]
    git(repo, "checkout", "-q", "-b", "side")
    git(repo, "rm", "-q", *gone)
    git(repo, "commit", "-qm", "delete")
    target = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    entries = target_entries(raw_git(home, repo), target, gone)

    writer = _write_all(home, repo, entries, workdir / "backup")

    assert not (repo / "a" / "b").exists()
    assert (repo / "a" / "keep" / "4.txt").is_file()
    writer.undo()
    assert all((repo / name).read_text() == name for name in gone)
    assert git(repo, "status", "--porcelain") == ""
