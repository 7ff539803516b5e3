"""What a worker's files never carry out of its container (bridge/workspace/modes.py): every
set-user-id and set-group-id bit cleared and every device removed, at any depth and in folders
made unreadable, never through a link; what is harmless is left as it was."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bridge.workspace.modes import disarm


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_disarm_clears_the_bits_and_removes_devices_without_following_links(workdir: Path):
    root, outside = workdir / "root", workdir / "outside"
    deep = root / "a" / "b" / "locked"
    deep.mkdir(parents=True)
    outside.mkdir()
    for path, mode in (
        (root / "suid", 0o4755),
        (root / "a" / "sgid", 0o2711),
        (deep / "both", 0o6777),
        (root / "plain", 0o755),
        (outside / "theirs", 0o4755),
    ):
        path.write_bytes(b"#!/bin/sh\n")
        path.chmod(mode)
    (root / "link").symlink_to(outside / "theirs")  # never followed: the host's file stays
    os.mkfifo(root / "fifo")
    if os.geteuid() == 0:
        os.mknod(root / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    (root / "sgid-dir").mkdir()
    (root / "sgid-dir").chmod(0o2775)  # a folder's set-group-id bit runs nothing
    deep.chmod(0)  # made unreadable by the worker: opened all the same
    changed = disarm(root)
    deep.chmod(0o755)
    assert sorted(changed) == sorted(
        ["suid", "a/sgid", "a/b/locked/both", *(["zero"] if os.geteuid() == 0 else [])]
    )
    assert (_mode(root / "suid"), _mode(root / "a" / "sgid")) == (0o755, 0o711)
    assert _mode(deep / "both") == 0o777 and _mode(root / "plain") == 0o755
    assert _mode(outside / "theirs") == 0o4755 and (root / "link").is_symlink()
    assert stat.S_ISFIFO(os.lstat(root / "fifo").st_mode) and not os.path.lexists(root / "zero")
    assert _mode(root / "sgid-dir") == 0o2775
    assert disarm(root) == []


def test_disarm_of_listed_entries_touches_only_those(workdir: Path):
    root = workdir / "root"
    root.mkdir()
    for name in ("listed", "unlisted"):
        (root / name).write_bytes(b"x")
        (root / name).chmod(0o4755)
    assert disarm(root, [("listed", os.lstat(root / "listed").st_mode), ("gone", 0o104755)]) == [
        "listed"
    ]
    assert (_mode(root / "listed"), _mode(root / "unlisted")) == (0o755, 0o4755)


@pytest.mark.skipif(os.geteuid() == 0, reason="the owner's own files, as a non-root bridge")
def test_a_non_root_owner_clears_the_bits_of_a_file_it_cannot_read(workdir: Path):
    root = workdir / "root"
    root.mkdir()
    (root / "hidden").write_bytes(b"x")
    (root / "hidden").chmod(0o4111)
    assert disarm(root) == ["hidden"] and _mode(root / "hidden") == 0o111


def test_a_tree_too_deep_in_one_folder_does_not_spare_the_others(workdir: Path, monkeypatch):
    # The review's way: a git dir deeper than a walk goes raised before the CLI home and the
    # worktree were looked at, so their set-user-id files kept their bits.
    from bridge.errors import DiskFull
    from bridge.workspace import fs
    from bridge.workspace.modes import disarm_all

    monkeypatch.setattr(fs, "MAX_DEPTH", 8)
    gitdir, home, worktree = (workdir / name for name in ("gitdir", "home", "worktree"))
    deep = gitdir.joinpath(*["d"] * 12)
    deep.mkdir(parents=True)
    for folder in (home, worktree):
        folder.mkdir()
        (folder / "python").write_bytes(b"\x7fELF")
        (folder / "python").chmod(0o4755)
    with pytest.raises(DiskFull, match="too deep"):
        disarm_all([(gitdir, None), (home, None), (worktree, None)])
    assert _mode(home / "python") == 0o755 and _mode(worktree / "python") == 0o755
