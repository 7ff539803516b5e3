"""Accept's writer on its own (no engine): byte-exact writes, refusals that leave the user's
files alone, and undo that puts everything back, also across filesystems."""

from __future__ import annotations

import os
import tempfile
import zlib
from pathlib import Path

import pytest
from support.repos import git

from bridge.workspace import fs
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
    algo = Git(repo).out("rev-parse", "--show-object-format")
    writer = Writer(repo, backup, algorithm=algo)
    blobs = BlobReader(raw)
    try:
        writer.apply(entries, blobs)
    finally:
        blobs.close()
    assert check_written(repo, entries, writer.written, algo, 2**20) is None
    assert (repo / "calc.py").read_text() == "new calc\n"
    writer.undo()
    assert {n: (repo / n).read_bytes() for n in before} == before
    assert (repo / "tests" / "test_calc.py").is_file()
    assert not backup.exists()
    assert git(repo, "status", "--porcelain") == ""


def _algorithm(repo: Path) -> str:
    return Git(repo).out("rev-parse", "--show-object-format")


def _written_pair(home: Path, repo: Path, workdir: Path):  # noqa: ANN202
    target = _change(repo, {"calc.py": "exact bytes\n", "new/b.txt": "b\n"})
    entries = target_entries(raw_git(home, repo), target, ["calc.py", "new/b.txt"])
    writer = _write_all(home, repo, entries, workdir / "backup")
    assert check_written(repo, entries, writer.written, _algorithm(repo), 2**20) is None
    return entries, writer


@pytest.mark.parametrize(
    "meddle",
    [
        "rewritten in place",
        "other bytes of the same size, its mtime put back",
        "made a link",
        "removed",
        "mode changed",
    ],
)
def test_a_written_file_that_is_not_the_blob_is_caught(home, repo, workdir, meddle):
    entries, writer = _written_pair(home, repo, workdir)
    path = repo / "new" / "b.txt"
    st = path.stat()
    if meddle == "rewritten in place":
        path.write_text("something else\n")
    elif meddle == "other bytes of the same size, its mtime put back":
        path.write_text("c\n")  # the size, inode and mtime as written: only ctime tells
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif meddle == "made a link":
        path.unlink()
        path.symlink_to(workdir / "elsewhere")
    elif meddle == "removed":
        path.unlink()
    else:
        os.chmod(path, 0o755)
    assert check_written(repo, entries, writer.written, _algorithm(repo), 2**20) == "new/b.txt"


@pytest.mark.parametrize("meddle", ["the same bytes written again", "replaced by a copy"])
def test_another_file_with_the_blobs_bytes_is_read_back_and_passes(
    home, repo, workdir, meddle, monkeypatch
):
    """Not the file written, but the blob's bytes and mode: read back, as every file once was
    (what a filesystem that moves a file's times after it is written needs)."""
    entries, writer = _written_pair(home, repo, workdir)
    path = repo / "new" / "b.txt"
    if meddle == "the same bytes written again":
        path.write_text("b\n")
    else:
        copy = workdir / "copy"
        copy.write_text("b\n")
        os.chmod(copy, path.stat().st_mode)
        os.replace(copy, path)
    reads = []
    real = fs.read_regular
    monkeypatch.setattr(fs, "read_regular", lambda *a: reads.append(a[1]) or real(*a))
    assert check_written(repo, entries, writer.written, _algorithm(repo), 2**20) is None
    assert reads == ["new/b.txt"]  # only the one that is not the file written


def test_an_executable_written_without_its_bit_is_caught(home, repo, workdir):
    """A umask that takes the owner's execute bit: the file is not the blob's mode."""
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(repo / "run.sh", 0o755)
    git(repo, "add", "run.sh")
    git(repo, "commit", "-qm", "script")
    target = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    entries = target_entries(raw_git(home, repo), target, ["run.sh"])
    assert entries[0].mode == "100755"
    old = os.umask(0o177)
    try:
        writer = _write_all(home, repo, entries, workdir / "backup")
    finally:
        os.umask(old)
    assert check_written(repo, entries, writer.written, _algorithm(repo), 2**20) == "run.sh"


def test_a_links_target_changed_after_writing_is_caught(home, repo, workdir):
    target = _change(repo, {"calc.py": "changed\n"})
    git(repo, "checkout", "-q", target)
    (repo / "link").symlink_to("calc.py")
    git(repo, "add", "link")
    git(repo, "commit", "-qm", "link")
    target = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    entries = target_entries(raw_git(home, repo), target, ["calc.py", "link"])
    writer = _write_all(home, repo, entries, workdir / "backup")
    assert os.readlink(repo / "link") == "calc.py"
    algo = _algorithm(repo)
    assert check_written(repo, entries, writer.written, algo, 2**20) is None
    (repo / "link").unlink()
    (repo / "link").symlink_to("README.md")
    assert check_written(repo, entries, writer.written, algo, 2**20) == "link"
    # Even where the new link passed for the one written (an inode number used again, the
    # same length and times), its target is read again.
    writer.written["link"] = os.lstat(repo / "link")
    assert check_written(repo, entries, writer.written, algo, 2**20) == "link"


def test_a_damaged_object_store_is_never_written_into_the_users_tree(home, repo, workdir):
    """A loose object whose bytes are not the blob its name says: refused before anything of
    it is written, and everything written before it put back."""
    target = _change(repo, {"a.txt": "first\n", "b.txt": "the verified bytes\n"})
    entries = target_entries(raw_git(home, repo), target, ["a.txt", "b.txt"])
    sha = entries[1].sha
    assert sha is not None
    loose = repo / ".git" / "objects" / sha[:2] / sha[2:]
    assert loose.is_file()  # a fresh commit's objects are loose
    forged = b"forged bytes!!!!!!!\n"
    os.chmod(loose, 0o644)
    loose.write_bytes(zlib.compress(b"blob %d\0" % len(forged) + forged))

    with pytest.raises(Refused, match="damaged"):
        _write_all(home, repo, entries, workdir / "backup")

    assert not (repo / "a.txt").exists()
    assert not (repo / "b.txt").exists()
    assert git(repo, "status", "--porcelain") == ""


def _write_all(home: Path, repo: Path, entries, backup: Path) -> Writer:  # noqa: ANN001
    writer = Writer(repo, backup, tracked_paths(repo), algorithm=_algorithm(repo))
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
