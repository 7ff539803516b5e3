"""The background remover on its own (no engine): what goes into the trash is taken out of the
way at once and removed by a process of its own, never following a link; folders arriving
while it works are removed too; prune's `reap` waits for it and finishes what it left."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.waiting import poll

from bridge.workspace import trash


def _tree(root: Path, files: int = 50) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    for i in range(files):
        (root / "sub" / f"{i}.txt").write_text(str(i))
    (root / "sub" / "deeper" / "x").write_text("x")
    return root


def _remover_running(home: Path) -> bool:
    fd = os.open(home / "locks" / "trash.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_discarded_folder_is_gone_at_once_and_removed_in_the_background(home, workdir):
    folder = _tree(home / "tasks" / "t1" / "verify-0")

    assert trash.discard(home, folder) == []

    assert not folder.exists()
    poll(lambda: not os.listdir(trash.trash_dir(home)), "the trash to be emptied", 30)
    poll(lambda: not _remover_running(home), "the remover to exit", 30)


def test_the_remover_never_follows_a_link_out_of_what_it_removes(home, workdir):
    outside = workdir / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    folder = _tree(home / "worktrees" / "t2")
    os.symlink(outside, folder / "to-outside")
    os.symlink(outside / "keep.txt", folder / "sub" / "to-file")
    os.mkfifo(folder / "fifo")
    locked = folder / "locked"
    (locked / "inner").mkdir(parents=True)
    os.chmod(locked / "inner", 0)
    os.chmod(locked, 0)

    trash.discard(home, folder)

    assert trash.reap(home) == []
    assert os.listdir(trash.trash_dir(home)) == []
    assert (outside / "keep.txt").read_text() == "keep\n"


def test_folders_discarded_while_the_remover_works_are_removed_too(home, workdir):
    for n in range(20):
        trash.discard(home, _tree(home / "tasks" / f"t{n}" / "checkout", files=200))

    assert trash.reap(home) == []
    assert os.listdir(trash.trash_dir(home)) == []
    assert not _remover_running(home)


def test_reap_finishes_what_a_killed_remover_left(home, workdir):
    trash.trash_dir(home).mkdir(parents=True)
    left = _tree(trash.trash_dir(home) / "left-by-a-killed-remover")

    assert trash.reap(home) == []

    assert not left.exists()


def test_what_cannot_be_removed_is_reported_and_the_remover_does_not_spin_on_it(home):
    stuck = _tree(home / "tasks" / "t" / "stuck")
    immutable = stuck / "sub" / "0.txt"  # what even root cannot unlink
    if subprocess.run(["chattr", "+i", str(immutable)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem (or user) cannot set the immutable flag")
    try:
        trash.discard(home, stuck)
        poll(lambda: not _remover_running(home), "the remover to give up and exit", 30)
        failed = trash.reap(home)
        assert len(failed) >= 1 and "0.txt" in failed[0]
    finally:
        for entry in trash.trash_dir(home).iterdir():
            subprocess.run(["chattr", "-i", str(entry / "sub" / "0.txt")], check=False)
    assert trash.reap(home) == []
    assert os.listdir(trash.trash_dir(home)) == []


def test_a_folder_on_another_filesystem_is_removed_on_the_spot(home, workdir, tmp_path_factory):
    other = Path(tmp_path_factory.mktemp("elsewhere"))  # not the state root's filesystem here
    folder = _tree(other / "checkout")
    if os.stat(other).st_dev == os.stat(home).st_dev:
        pytest.skip("the temporary folder and the state root share a filesystem here")

    assert trash.discard(home, folder) == []

    assert not folder.exists()


def test_the_remover_starts_without_importing_the_facade(home):
    code = (
        "import sys, types\n"
        f"package = types.ModuleType('bridge'); package.__path__ = [{str(trash._PACKAGE)!r}]\n"
        "sys.modules['bridge'] = package\n"
        "import bridge.workspace.trash\n"
        "print(sorted(m for m in sys.modules if m.startswith(('bridge', 'pydantic', 'docker'))))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(
        ["bridge", "bridge.workspace", "bridge.workspace.fs", "bridge.workspace.trash"]
    )


def test_reap_waits_for_a_clean_up_still_running_in_this_process(home, workdir):
    import threading

    folder = _tree(home / "worktrees" / "t1")
    go = threading.Event()

    def clean_up() -> None:
        go.wait(30)
        trash.discard(home, folder)

    trash.later(clean_up)
    trash.later(lambda: 1 / 0)  # an error in one is dropped; the others go on
    reaped = threading.Thread(target=trash.reap, args=(home,))
    reaped.start()
    reaped.join(0.3)
    assert reaped.is_alive() and folder.exists()  # reap waits for the clean-up first
    go.set()
    reaped.join(30)
    assert not reaped.is_alive()
    assert not folder.exists() and not trash._entries(home)


def test_a_clean_up_that_fails_says_so_on_the_log(caplog):
    with caplog.at_level("WARNING", logger="worker_bridge.trash"):
        trash.later(lambda: 1 / 0)
        trash.wait_for_later(30)
    assert "workspaces prune --apply" in caplog.text and "ZeroDivisionError" in caplog.text
