"""Other local users and host processes of the sandbox uid (issue 43, items 1-3), through the
real engine, the way each would attack: what a worker leaves on the host is nobody's way in,
and nothing but the bridge touches a check's inputs. Each test is one promise of
docs/security.md ("Other local users, and host processes of the sandbox uid")."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from support.repos import git
from support.tasks import mock_task, start_spec, wait_until_done
from support.users import local_user, run_as
from support.waiting import poll

pytestmark = [
    pytest.mark.usefixtures("docker_images"),
    pytest.mark.skipif(os.geteuid() != 0, reason="other local users are made with useradd"),
]

SANDBOX_UID = 10001  # the default sandbox_uid of a root bridge
CONTAINER_GITDIR = "/var/lib/worker-bridge/git"
IDENTITY = "import os; print(os.geteuid(), os.getegid())"

# The worker plants a setuid (and setgid) copy of python in its worktree, its private git dir and
# its CLI home, tries to make a device, then says it is ready and waits for the test's `go`.
PLANT = (
    "cp /usr/bin/python3.11 .helper && chmod 4755 .helper; "
    f"cp /usr/bin/python3.11 {CONTAINER_GITDIR}/.helper && chmod 6755 {CONTAINER_GITDIR}/.helper; "
    'cp /usr/bin/python3.11 "$HOME/.helper" && chmod 2755 "$HOME/.helper"; '
    "mknod mem c 1 1 2>/dev/null; "
    "touch ready; while [ ! -e go ]; do sleep 0.05; done; rm -f go ready"
)


def _helpers(home: Path, task_id: str) -> dict[str, Path]:
    return {
        "worktree": home / "worktrees" / task_id / ".helper",
        "private git dir": home / "gitdirs" / task_id / "git" / ".helper",
        "CLI home": home / "tasks" / task_id / "home" / ".helper",
    }


def _run_helper(path: Path):
    """Run ``path`` (a copy of python) and say the identity it got, or why it could not run."""

    def attempt() -> str:
        try:
            ran = subprocess.run(
                [str(path), "-I", "-c", IDENTITY], capture_output=True, text=True, timeout=60
            )
        except OSError as exc:
            return f"refused: {exc.strerror}"
        return ran.stdout.strip() or ran.stderr.strip()[-200:]

    return attempt


def _open_way(home: Path, paths: list[Path]) -> None:
    """Let others walk to (not list) ``paths``: what a state root others can enter gave them
    before, and what a mistake in its privacy would give them again."""
    for path in paths:
        folder = path.parent
        while folder != home.parent:
            folder.chmod(stat.S_IMODE(folder.stat().st_mode) | 0o011)
            folder = folder.parent


@pytest.mark.parametrize("checkout", ["layered", "full"])
def test_a_worker_s_setuid_python_gives_another_local_user_nothing(cli, workdir, repo, checkout):
    home = workdir / "home"
    home.rmdir()  # the bridge makes its state root, as on a first run
    env = {"WORKER_BRIDGE_LAYERED_CHECKOUTS": "true" if checkout == "layered" else "false"}
    spec = mock_task(repo, {"script": PLANT}, verify=["true"])
    task_id = start_spec(cli, workdir, spec, env)
    worktree = home / "worktrees" / task_id
    poll(lambda: (worktree / "ready").exists(), "the worker's setuid copies", 120)
    helpers = _helpers(home, task_id)
    with local_user() as other:
        # While the worker runs: the state root is the bridge's alone; another user does not
        # even reach the files.
        for where, path in helpers.items():
            got = run_as(other.pw_uid, other.pw_gid, _run_helper(path))
            assert got == "refused: Permission denied", (where, got)
        if checkout == "layered":  # mounted nosuid and nodev: no bit counts there, ever
            flags = os.statvfs(worktree).f_flag
            assert flags & os.ST_NOSUID and flags & os.ST_NODEV
            verify = home / "mounts" / f"{task_id}--verify-0"
            poll(lambda: os.path.ismount(verify), "the prepared verification checkout", 120)
            flags = os.statvfs(verify).f_flag
            assert flags & os.ST_NOSUID and flags & os.ST_NODEV
        (worktree / "go").touch()
        result = wait_until_done(cli, task_id, env, deadline_s=300)
        assert result["status"] == "succeeded", result
        # Collected: every set-user-id and set-group-id bit is gone, devices too, and the
        # snapshot records an ordinary executable.
        for where, path in helpers.items():
            mode = path.lstat().st_mode
            assert not mode & (stat.S_ISUID | stat.S_ISGID), (where, oct(mode))
            assert mode & stat.S_IXUSR, where
        assert not os.path.lexists(worktree / "mem")
        listed = git(repo, "ls-tree", f"worker-bridge/{task_id}", "--", ".helper")
        assert listed.startswith("100755 blob"), listed
        # Even with a way to the files, another user runs them as itself.
        _open_way(home, list(helpers.values()))
        mine = f"{other.pw_uid} {other.pw_gid}"
        for where, path in helpers.items():
            assert run_as(other.pw_uid, other.pw_gid, _run_helper(path)) == mine, where


# The worker breaks calc.py, says it is ready and waits for the test's `go`; verification runs
# the repository's own check.sh on the snapshot, which must fail.
BREAK = (
    "printf 'def add(a, b):\\n    return a - b\\n' > calc.py; "
    "touch ready; while [ ! -e go ]; do sleep 0.05; done; rm -f go ready"
)


def test_a_host_process_as_the_sandbox_uid_touches_none_of_a_running_task_s_inputs(
    cli, workdir, repo
):
    """An account with the sandbox uid, while a worker runs: it tries to rewrite the check of
    the verification checkout prepared meanwhile (so that the broken change passes), to write
    into the worktree, and to reach the task's gateway (model routes carry the host's key). By
    path, the state root lets it reach none of them; verification fails as it should."""
    from support.repos import commit_files

    commit_files(repo, {"check.sh": 'grep -q "a + b" calc.py\n'}, "the check")
    home = workdir / "home"
    home.rmdir()  # the bridge makes its state root, as on a first run
    spec = mock_task(
        repo,
        {"script": BREAK},
        verify=["sh check.sh"],
        network={"mode": "allowlist", "domains": ["example.com"]},
    )
    task_id = start_spec(cli, workdir, spec)
    worktree, gateway = home / "worktrees" / task_id, home / "gateways" / task_id
    prepared = home / "mounts" / f"{task_id}--verify-0"
    poll(lambda: (worktree / "ready").exists(), "the worker", 120)
    poll(lambda: (prepared / "check.sh").exists(), "the prepared verification checkout", 120)
    assert (gateway / "routes.sock").exists() and (gateway / "proxy.sock").exists()

    def attack() -> dict[str, str]:
        import socket

        tried: dict[str, str] = {}

        def attempt(name: str, action) -> None:
            try:
                action()
                tried[name] = "done"
            except OSError as exc:
                tried[name] = exc.strerror or str(exc)

        def write(path: Path, text: str) -> None:
            with open(path, "w") as file:
                file.write(text)

        def connect(path: Path) -> None:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(str(path))

        attempt("prepared check", lambda: write(prepared / "check.sh", "exit 0\n"))
        attempt("prepared conftest", lambda: write(prepared / "conftest.py", ""))
        attempt("worktree", lambda: write(worktree / "check.sh", "exit 0\n"))
        attempt("routes socket", lambda: connect(gateway / "routes.sock"))
        attempt("proxy socket", lambda: connect(gateway / "proxy.sock"))
        attempt("state root", lambda: os.listdir(home))
        return tried

    tried = run_as(SANDBOX_UID, SANDBOX_UID, attack)
    assert tried == dict.fromkeys(tried, "Permission denied") and len(tried) == 6, tried
    (worktree / "go").touch()
    result = wait_until_done(cli, task_id, deadline_s=300)
    assert result["status"] == "failed", result
    assert result["verification"]["ok"] is False
    assert not gateway.exists()  # no empty gateway folder is left behind


def test_a_change_too_big_to_snapshot_still_leaves_no_setuid_file(cli, workdir, repo):
    """More files than `limits.files`: the task fails before a snapshot is made (which is where
    a full worktree's bits are cleared), and the worker's setuid python loses its bit all the
    same."""
    home = workdir / "home"
    plant = (
        "cp /usr/bin/python3.11 .helper && chmod 4755 .helper; "
        "mkdir many; for i in $(seq 1 150); do : > many/f$i; done"
    )
    spec = mock_task(repo, {"script": plant}, verify=["true"], limits={"files": 100})
    env = {"WORKER_BRIDGE_LAYERED_CHECKOUTS": "false"}
    task_id = start_spec(cli, workdir, spec, env)
    result = wait_until_done(cli, task_id, env, deadline_s=300)
    assert result["status"] == "failed" and result["error"]["kind"] == "disk", result
    mode = (home / "worktrees" / task_id / ".helper").lstat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID), oct(mode)
