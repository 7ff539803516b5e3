"""The warm process (bridge/warm): a command it runs behaves as the same command run alone
(output, exit status, environment, working folder, umask, signals), it never runs stale code,
one serves per name, it stops when idle, and it serves no one but its user from no folder but a
private one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import CLI
from support.waiting import poll, process_gone

from bridge.warm.client import control, stop_all

NOBODY = 65534


@pytest.fixture
def folder() -> Iterator[Path]:
    """A warm folder of this test's own (short: a socket's path has a length limit)."""
    path = Path(tempfile.mkdtemp(prefix="wbw-", dir="/tmp"))
    yield path
    stop_all(str(path))
    subprocess.run(["rm", "-rf", str(path)], check=False)


def environment(folder: Path, home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "WORKER_BRIDGE_WARM_DIR": str(folder), "WORKER_BRIDGE_HOME": str(home)}
    env.pop("WORKER_BRIDGE_WARM", None)
    return {**env, **extra}


def run(env: dict[str, str], *args: str, **options) -> tuple[subprocess.CompletedProcess, dict]:
    """`worker-bridge ARGS`: the process, and what the warm process reported ({} when the
    command ran in its own process)."""
    with tempfile.NamedTemporaryFile() as report:
        proc = subprocess.run(
            [*CLI, *args],
            env={**env, "WORKER_BRIDGE_WARM_REPORT": report.name},
            capture_output=True,
            text=True,
            timeout=120,
            **options,
        )
        return proc, json.loads(report.read() or "{}")


def server(folder: Path) -> dict | None:
    socks = list(folder.glob("*.sock"))
    return control("status", str(socks[0])) if len(socks) == 1 else None


def started(folder: Path, env: dict[str, str]) -> dict:
    """Start the warm process with a first command (run alone) and wait until it answers."""
    first, served = run(env, "--help")
    assert first.returncode == 0 and not served, first.stderr
    poll(lambda: server(folder), "the warm process to answer", 60)
    return server(folder)


def test_a_served_command_prints_exits_and_sees_what_it_would_alone(folder, workdir, repo):
    env = environment(folder, workdir / "home")
    pid = started(folder, env)["server"]
    cases = [
        ("--help",),
        ("tasks", "list", "--json"),
        ("tasks", "bogus"),  # argparse's exit 2
        ("tasks", "show", "no-such-task"),
        ("tasks", "create", "--json", "--repo", ".", "--worker", "nope", "--objective", "x"),
    ]
    for args in cases:
        alone, _ = run({**env, "WORKER_BRIDGE_WARM": "0"}, *args, cwd=repo)
        served, report = run(env, *args, cwd=repo)
        assert report, f"{args} was not served by the warm process"
        assert report["exit"] == served.returncode
        assert (served.returncode, served.stdout, served.stderr) == (
            alone.returncode,
            alone.stdout,
            alone.stderr,
        ), args
    # Each command has its own environment, working folder and umask.
    for name, mask in (("a", 0o077), ("b", 0o022)):
        env_x = environment(folder, workdir / name)
        created, report = run(
            env_x,
            *("tasks", "create", "--repo", ".", "--worker", "mock", "--objective", name),
            cwd=repo,
            preexec_fn=lambda m=mask: os.umask(m),
        )
        assert created.returncode == 0 and report, created.stderr
        db_mode = stat.S_IMODE((workdir / name / "bridge.db").stat().st_mode)
        assert db_mode == 0o666 & ~mask, oct(db_mode)
        listed, _ = run(env_x, "tasks", "list", "--json")
        tasks = json.loads(listed.stdout)["tasks"]
        assert [t["objective"] for t in tasks] == [name]
        assert tasks[0]["repository"] == str(repo)
    assert server(folder)["server"] == pid  # one process served all of them


@contextlib.contextmanager
def long_command(folder: Path, env: dict[str, str], **options) -> Iterator[tuple]:
    """`worker-bridge mcp` (it runs until its stdin ends) served by the warm process: the
    client, and the child that is the command."""
    poll(lambda: not server(folder)["children"], "the last command's end to be reported", 30)
    client = subprocess.Popen(
        [*CLI, "mcp"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **options,
    )
    try:
        poll(lambda: server(folder)["children"], "the command to start", 30)
        (child,) = server(folder)["children"]
        assert child != client.pid
        poll(lambda: _has_pidfd(client.pid), "the client to hear the command started", 30)
        yield client, child
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def _has_pidfd(pid: int) -> bool:
    """Whether the client opened its command's pidfd: it does once the command said it started
    (a command killed before that never started, and the client runs it itself)."""
    fds = Path(f"/proc/{pid}/fd")
    return any(os.readlink(fd) == "anon_inode:[pidfd]" for fd in fds.iterdir())


def test_signals_reach_the_command_and_a_client_killed_outright_takes_it_along(folder, workdir):
    env = environment(folder, workdir / "home")
    started(folder, env)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with long_command(folder, env) as (client, child):
            client.send_signal(signum)
            assert client.wait(30) == -signum
            poll(lambda c=child: process_gone(c), f"command {child} to end", 30)
    # killed itself: the client dies of the same signal, and says nothing
    with long_command(folder, env) as (client, child):
        os.kill(child, signal.SIGKILL)
        assert client.wait(30) == -signal.SIGKILL
        assert b"Traceback" not in client.stderr.read()
    poll(lambda: not server(folder)["children"], "the warm process to report every end", 30)


def test_a_signal_the_caller_ignores_is_ignored_by_the_command(folder, workdir):
    """As under `nohup`: a hang-up the caller was started ignoring ends neither it nor the
    command."""
    env = environment(folder, workdir / "home")
    started(folder, env)
    ignore = lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)  # noqa: E731
    with long_command(folder, env, preexec_fn=ignore) as (client, child):
        client.send_signal(signal.SIGHUP)
        os.kill(child, signal.SIGHUP)
        time.sleep(1)
        assert client.poll() is None and not process_gone(child)
        client.send_signal(signal.SIGTERM)
        assert client.wait(30) == -signal.SIGTERM


def test_a_command_outlives_a_lost_warm_process_and_its_client_waits_for_it(folder, workdir):
    env = environment(folder, workdir / "home")
    pid = started(folder, env)["server"]
    with long_command(folder, env) as (client, child):
        os.kill(pid, signal.SIGKILL)
        time.sleep(1)
        assert client.poll() is None, "the client left its command running alone"
        client.send_signal(signal.SIGTERM)  # still passed on to the command
        assert client.wait(30) == 1
        assert process_gone(child)
        assert b"warm process was lost" in client.stderr.read()


def test_a_closed_stdin_is_the_null_device_not_the_socket(folder, workdir):
    env = environment(folder, workdir / "home")
    started(folder, env)
    proc, report = run(env, "tasks", "list", "--json", preexec_fn=lambda: os.close(0))
    assert proc.returncode == 0 and report, proc.stderr
    assert json.loads(proc.stdout) == {"tasks": []}
    assert not server(folder)["children"]


def test_a_caller_confined_otherwise_is_never_served_by_an_unconfined_process(folder, workdir):
    """A caller under no-new-privileges (or other capabilities, groups, seccomp, namespaces or
    cgroup) naming the socket of a warm process that has none is refused: its command is not
    forked with more than it has."""
    env = environment(folder, workdir / "home")
    started(folder, env)
    (sock,) = folder.glob("*.sock")
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({str(sock)!r})\n"
        "s.sendall(b'\\x00\\x00\\x00\\x10{\"status\": true}')\n"
        "print(s.recv(100))\n"
    )
    confined = ["setpriv", "--no-new-privs", "/usr/bin/python3", "-I", "-c", code]
    answer = subprocess.run(confined, capture_output=True, text=True, timeout=30)
    assert answer.stdout.strip() in ("b''", ""), answer  # closed unanswered
    proc, report = run(env, "tasks", "list")  # the same, unconfined, is served
    assert proc.returncode == 0 and report


def test_stale_code_is_never_run_and_the_process_that_loaded_it_stops(folder, workdir):
    extra = workdir / "extra-path"
    extra.mkdir()
    env = environment(folder, workdir / "home", PYTHONPATH=str(extra))
    pid = started(folder, env)["server"]
    assert run(env, "tasks", "list")[1], "not served before the change"
    (extra / "newly-1.0.dist-info").mkdir()  # a distribution installed on sys.path
    proc, report = run(env, "tasks", "list")
    assert proc.returncode == 0, proc.stderr
    assert not report, "a command was served after the code changed"
    poll(lambda: process_gone(pid), "the stale warm process to stop", 30)
    poll(lambda: server(folder), "a fresh warm process to answer", 60)  # the command started it
    assert server(folder)["server"] != pid
    assert run(env, "tasks", "list")[1]


def test_a_changed_module_of_the_bridge_is_never_served_from_memory(folder, workdir):
    import bridge.version

    env = environment(folder, workdir / "home")
    pid = started(folder, env)["server"]
    path = Path(bridge.version.__file__)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # as an edit does
    try:
        proc, report = run(env, "tasks", "list")
    finally:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert proc.returncode == 0 and not report, proc.stderr
    poll(lambda: process_gone(pid), "the stale warm process to stop", 30)


def test_a_module_dated_in_the_future_does_not_keep_it_from_serving(folder, workdir):
    """Only a file that changed while it loaded makes the first command refused: one an archive
    left dated in the future did not (else every command would start a warm process in vain)."""
    import bridge.version

    path = Path(bridge.version.__file__)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, time.time_ns() + 3600 * 10**9))
    try:
        env = environment(folder, workdir / "home")
        started(folder, env)
        proc, report = run(env, "tasks", "list")
    finally:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert proc.returncode == 0 and report, proc.stderr


def test_one_serves_per_name(folder, workdir):
    env = environment(folder, workdir / "home")
    argv = [sys.executable, "-P", "-m", "bridge.warm.server", str(folder), "samename"]
    procs = [subprocess.Popen(argv, env=env, cwd="/") for _ in range(3)]
    try:
        answer = poll(lambda: control("status", str(folder / "samename.sock")), "an answer", 60)
        poll(lambda: sum(p.poll() is None for p in procs) == 1, "all but one to give up", 60)
        assert sorted(p.returncode for p in procs if p.poll() is not None) == [0, 0]
        (alive,) = [p for p in procs if p.poll() is None]
        assert answer["server"] == alive.pid
        control("stop", str(folder / "samename.sock"))
        assert alive.wait(30) == 0
        assert not (folder / "samename.sock").exists()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_it_stops_when_idle_and_on_sigterm(folder, workdir):
    env = environment(folder, workdir / "home", WORKER_BRIDGE_WARM_IDLE_S="3")
    pid = started(folder, env)["server"]
    poll(lambda: process_gone(pid), "the idle warm process to stop", 60)
    assert not list(folder.glob("*.sock"))
    env = environment(folder, workdir / "home")
    pid = started(folder, env)["server"]
    os.kill(pid, signal.SIGTERM)
    poll(lambda: process_gone(pid), "the warm process to stop on SIGTERM", 30)
    assert not list(folder.glob("*.sock"))


@pytest.mark.parametrize("kind", ["open to others", "a link", "another user's"])
def test_no_folder_but_a_private_one_is_used(kind, workdir):
    """A socket in a folder others can write, reached through a link, or owned by someone else
    could be anyone's listener: the command (its environment, its streams) is never sent
    there, and no warm process starts there."""
    public = Path(tempfile.mkdtemp(prefix="wbw-", dir="/tmp"))
    try:
        target = public
        if kind == "open to others":
            public.chmod(0o777)
        elif kind == "a link":
            target = Path(tempfile.mktemp(prefix="wbw-", dir="/tmp"))
            target.symlink_to(public)
        else:
            os.chown(public, NOBODY, NOBODY)
        env = environment(target, workdir / "home")
        planted = socket.socket(socket.AF_UNIX)
        planted.bind(str(public / f"{_name_for(env)}.sock"))
        planted.listen(8)
        planted.setblocking(False)
        for _ in range(2):
            proc, report = run(env, "tasks", "list")
            assert proc.returncode == 0 and not report, proc.stderr
        time.sleep(2)  # what a warm process started now would take to bind
        with pytest.raises(BlockingIOError):
            planted.accept()
        assert sorted(p.name for p in public.iterdir()) == [f"{_name_for(env)}.sock"]
    finally:
        if target != public:
            target.unlink()
        subprocess.run(["rm", "-rf", str(public)], check=False)


def _name_for(env: dict[str, str]) -> str:
    """The socket name a command with ``env`` uses (it depends on the PYTHON* variables)."""
    code = "from bridge.warm.client import name; print(name())"
    return subprocess.run(
        [str(Path(CLI[0]).parent / "python3"), "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_another_user_is_refused_even_with_the_socket_opened_to_them(folder, workdir):
    env = environment(folder, workdir / "home")
    started(folder, env)
    (sock,) = folder.glob("*.sock")

    def connect_as_nobody() -> str:
        """What a process of another user gets from the socket (the system's interpreter:
        that user cannot run this one, under /root)."""
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "s.settimeout(10)\n"
            "try:\n"
            f"    s.connect({str(sock)!r})\n"
            "    s.sendall(b'\\x00\\x00\\x00\\x10{\"status\": true}')\n"
            "    print('answer', s.recv(100))\n"
            "except OSError as exc:\n"
            "    print('refused', type(exc).__name__)\n"
        )
        as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        return subprocess.run(
            [*as_nobody, "/usr/bin/python3", "-I", "-c", code],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()

    assert connect_as_nobody().startswith("refused PermissionError")  # the folder is 0700
    folder.chmod(0o755)
    sock.chmod(0o777)
    try:
        refused = connect_as_nobody()  # connected, then closed unanswered (or reset)
    finally:
        folder.chmod(0o700)
    assert refused == "answer b''" or refused.startswith("refused "), refused
    assert run(env, "tasks", "list")[1], "the warm process stopped serving its own user"


def test_a_task_run_warm_succeeds_and_its_containers_cannot_see_the_warm_process(
    folder, workdir, repo, docker_images
):
    """The warm process's socket is on the host only: neither the worker's container nor the
    verifier's has its folder (a worker that reached it could run commands as the user)."""
    from support.tasks import task_flags

    env = environment(folder, workdir / "home")
    started(folder, env)
    probe = f"if [ -e {folder} ]; then echo seen; else echo absent; fi"
    flags = task_flags(
        repo,
        "look for the warm socket",
        verify=(f"test ! -e {folder}", "grep -qx absent probe.txt"),
        metadata={"mock": {"script": f"{probe} > probe.txt"}},
    )
    proc, report = run(env, "tasks", "run", "--json", *flags)
    assert report, "the task was not run by the warm process"
    result = json.loads(proc.stdout)
    assert result["status"] == "succeeded", (result["error"], proc.stderr)
    assert [c["path"] for c in result["changed_files"]] == ["probe.txt"]
    assert result["verification"]["ok"] is True


def test_a_bridge_package_where_a_command_runs_is_never_imported(
    folder, workdir, repo, cli, docker_images
):
    """A folder holding a `bridge` package (a repository's own, or one a worker wrote and the
    user accepted) is where a user may run `worker-bridge`: neither the warm process nor a
    detached runner (`tasks start`) imports it in place of the installed package."""
    from support.tasks import task_flags, wait_until_done

    planted = workdir / "planted"
    marker = workdir / "imported"
    for package in ("bridge", "bridge/pipeline", "bridge/warm"):
        (planted / package).mkdir(parents=True)
        (planted / package / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    for module in ("bridge/pipeline/__main__.py", "bridge/warm/server.py"):
        (planted / module).write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    env = environment(folder, workdir / "home")
    for _ in range(2):  # run alone (starting the warm process from here), then served
        flags = task_flags(repo, "x", metadata={"mock": {"script": "echo a > a.txt"}})
        created, _ = run(env, "tasks", "create", *flags, cwd=planted)
        assert created.returncode == 0, created.stderr
        task_id = created.stdout.strip()
        started_, _ = run(env, "tasks", "start", task_id, cwd=planted)  # a detached runner
        assert started_.returncode == 0, started_.stderr
        assert wait_until_done(cli, task_id)["status"] == "succeeded"
        poll(lambda: server(folder), "the warm process to answer", 60)
    assert not marker.exists()


def test_what_a_worker_plants_and_the_user_accepts_is_never_run_by_later_commands(
    folder, workdir, repo, docker_images
):
    """A worker writes a `bridge` package, `sitecustomize.py`, `usercustomize.py` and a `.pth`
    at the repository's top, with a FIFO, a link, a name that is not UTF-8 and a 2 MB line
    beside them; the user accepts through the warm process from inside the repository and goes
    on running commands there, served and alone: none of the worker's Python is ever imported,
    the FIFO never arrives and the link arrives as a link."""
    from support.tasks import task_flags

    marker = workdir / "imported"
    payload = f"open({str(marker)!r}, 'a').write('x')"
    script = (
        "mkdir -p bridge/cli bridge/warm && "
        + " && ".join(
            f'echo "{payload}" > {name}'
            for name in (
                "bridge/__init__.py",
                "bridge/cli/__init__.py",
                "bridge/warm/__init__.py",
                "bridge/warm/server.py",
                "sitecustomize.py",
                "usercustomize.py",
            )
        )
        + f' && echo "import os; {payload}" > evil.pth'
        + " && mkfifo fifo && ln -s evil.pth link"
        + " && printf x > \"$(printf 'caf\\351.txt')\""
        + " && head -c 2000000 /dev/zero | tr '\\0' a > long.txt"
    )
    env = environment(folder, workdir / "home")
    started(folder, env)
    flags = task_flags(repo, "plant", verify=("true",), metadata={"mock": {"script": script}})
    proc, report = run(env, "tasks", "run", "--json", *flags, cwd=repo)
    assert report, "not served"
    result = json.loads(proc.stdout)
    assert result["status"] == "succeeded", result["error"]
    arrived = {c["path"] for c in result["changed_files"]}
    assert "fifo" not in arrived and "fifo" in {d["path"] for d in result["dropped"]}
    accepted, report = run(env, "tasks", "accept", result["task_id"], cwd=repo)
    assert accepted.returncode == 0 and report, accepted.stderr
    assert (repo / "bridge" / "warm" / "server.py").exists()
    assert (repo / "caf\udce9.txt").read_bytes() == b"x"
    assert not (repo / "fifo").exists()
    assert os.readlink(repo / "link") == "evil.pth"  # a link stays a link (one out is refused)
    for warm in ("1", "0"):
        for args in (("tasks", "list"), ("tasks", "show", result["task_id"]), ("--help",)):
            later, _ = run({**env, "WORKER_BRIDGE_WARM": warm}, *args, cwd=repo)
            assert later.returncode == 0, later.stderr
    assert not marker.exists(), "the worker's Python ran on the host"
