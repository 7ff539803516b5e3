"""Accept's writer on its own (no engine): byte-exact writes, refusals that leave the user's
files alone, and undo that puts everything back, also across filesystems."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from support.repos import git

from bridge.workspace import writer
from bridge.workspace.git import Git
from bridge.workspace.rawgit import raw_git


def _change(repo: Path, files: dict[str, str]) -> str:
    """A commit on a side branch with ``files`` changed; returns its sha (HEAD unchanged)."""
    git(repo, "checkout", "-q", "-b", "side")
    for name, text in files.items():
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
    entries = writer.target_entries(raw, target, ["calc.py", "app.log"])
    assert "app.log" not in writer.dirty_paths(repo)  # git status does not show it
    with pytest.raises(writer.Refused, match="not tracked"):
        writer.check_entries(repo, entries, writer.dirty_paths(repo), writer.tracked_paths(repo))
    assert (repo / "app.log").read_text() == "the user's log\n"


def test_undo_puts_every_file_back_even_with_backups_on_another_filesystem(home, repo):
    target = _change(repo, {"calc.py": "new calc\n", "README.md": "new readme\n"})
    before = {n: (repo / n).read_bytes() for n in ("calc.py", "README.md")}
    raw = raw_git(home, repo)
    entries = writer.target_entries(raw, target, ["calc.py", "README.md", "tests/test_calc.py"])
    backup = Path(tempfile.mkdtemp(dir="/tmp")) / "backup"  # /tmp: not the repository's disk
    written = writer.Writer(repo, backup)
    blobs = writer.BlobReader(raw)
    try:
        written.apply(entries, blobs)
    finally:
        blobs.close()
    algo = Git(repo).out("rev-parse", "--show-object-format")
    assert writer.check_written(repo, entries, algo, 2**20) is None
    assert (repo / "calc.py").read_text() == "new calc\n"
    written.undo()
    assert {n: (repo / n).read_bytes() for n in before} == before
    assert (repo / "tests" / "test_calc.py").is_file()
    assert not backup.exists()
    assert git(repo, "status", "--porcelain") == ""


def test_a_written_file_that_differs_from_its_blob_is_caught(home, repo):
    target = _change(repo, {"calc.py": "exact bytes\n"})
    raw = raw_git(home, repo)
    entries = writer.target_entries(raw, target, ["calc.py"])
    (repo / "calc.py").write_text("something else\n")
    algo = Git(repo).out("rev-parse", "--show-object-format")
    assert writer.check_written(repo, entries, algo, 2**20) == "calc.py"
    os.chmod(repo / "calc.py", 0o755)
