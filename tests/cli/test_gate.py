"""The CLI's start turns (bridge/cli/gate.py): at most one command per CPU loads at a time,
held by real processes here; a turn comes free when its holder dies however it dies; and the
gate never fails a command, nor touches what a planted link points at. No timings: the figure
it serves is bench/concurrency.py's."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from bridge.cli import main
from bridge.cli.gate import wait_for_turn

ROOT = Path(__file__).resolve().parents[2]
_HOLDER = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from bridge.cli.gate import wait_for_turn\n"
    "fd = wait_for_turn(Path(sys.argv[1]), int(sys.argv[2]), 5.0)\n"
    "print('held' if fd is not None else 'none', flush=True)\n"
    "time.sleep(60)\n"
)


def _holder(folder: Path, slots: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(folder), str(slots)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_no_more_turns_than_slots_and_a_killed_holder_frees_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "locks"
    holders = [_holder(folder, 2), _holder(folder, 2)]
    try:
        assert wait_for_turn(folder, 2, max_wait=0.3) is None  # both turns are held
        holders[0].send_signal(signal.SIGKILL)  # a holder killed mid-load
        holders[0].wait()
        fd = wait_for_turn(folder, 2, max_wait=5.0)
        assert fd is not None
        assert wait_for_turn(folder, 2, max_wait=0.2) is None  # and there are still two
        os.close(fd)
        fd = wait_for_turn(folder, 2, max_wait=5.0)  # closing one lets it go
        assert fd is not None
        os.close(fd)
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()


def test_a_waiter_gets_the_turn_its_holder_lets_go(tmp_path: Path) -> None:
    folder = tmp_path / "locks"
    holder = _holder(folder, 1)
    try:
        start = time.monotonic()
        assert wait_for_turn(folder, 1, max_wait=0.2) is None
        assert time.monotonic() - start >= 0.2  # it waited, it did not give up at once
        holder.terminate()
        holder.wait()
        fd = wait_for_turn(folder, 1, max_wait=5.0)
        assert fd is not None
        os.close(fd)
    finally:
        holder.kill()
        holder.wait()


def test_a_planted_link_is_never_followed_nor_written(tmp_path: Path) -> None:
    folder = tmp_path / "locks"
    folder.mkdir()
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    os.chmod(target, 0o644)
    (folder / "start-0").symlink_to(target)
    assert wait_for_turn(folder, 1, max_wait=0.2) is None  # the command goes without a turn
    assert target.read_text() == "keep me\n"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert (folder / "start-0").is_symlink()


def test_a_state_root_that_does_not_exist_is_not_made_by_the_gate(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "locks"
    assert wait_for_turn(missing, 2, max_wait=0.2) is None
    assert not (tmp_path / "nowhere").exists()


def test_a_command_goes_ahead_when_every_turn_stays_held(tmp_path: Path, monkeypatch) -> None:
    """Every turn held by a process that never lets go: the command waits its bound, then runs
    and answers as it would have (`tasks list` of an empty store, which the facade answers)."""
    home = tmp_path / "home"
    (home / "locks").mkdir(parents=True)
    monkeypatch.setenv("WORKER_BRIDGE_HOME", str(home))
    monkeypatch.setattr("bridge.cli.gate.MAX_WAIT_S", 0.3)
    monkeypatch.setattr("bridge.cli.gate.cpus", lambda: 1)
    import bridge.cli.gate as gate

    asked: list[int | None] = []

    def waited(folder: Path, slots: int, max_wait: float = 0.0) -> int | None:
        got = wait_for_turn(folder, slots, max_wait)
        asked.append(got)
        return got

    monkeypatch.setattr(gate, "wait_for_turn", waited)
    holder = _holder(home / "locks", 1)
    try:
        assert main(["tasks", "list", "--json"]) == 0
        assert asked == [None]  # it asked for a turn, got none within its bound, and ran
    finally:
        holder.kill()
        holder.wait()


def test_a_planted_fifo_or_device_is_refused_not_opened(tmp_path: Path) -> None:
    """What is not a regular file at a turn's name is never opened (a FIFO would block an open
    for reading; a device's open is its driver's): the command goes without a turn."""
    folder = tmp_path / "locks"
    folder.mkdir()
    os.mkfifo(folder / "start-0")
    assert wait_for_turn(folder, 1, max_wait=0.2) is None
    assert stat.S_ISFIFO((folder / "start-0").lstat().st_mode)
    if os.geteuid() == 0:  # a device node needs root to make
        os.unlink(folder / "start-0")
        os.mknod(folder / "start-0", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's
        assert wait_for_turn(folder, 1, max_wait=0.2) is None
        assert stat.S_ISCHR((folder / "start-0").lstat().st_mode)
