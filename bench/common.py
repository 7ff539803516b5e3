"""Shared helpers: a generated repository, timing and CPU time, medians and percentiles."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def scratch_root() -> Path:
    """Benchmarks run on tmpfs: the root disk here is slow at create-after-delete."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
    return root


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@example.com",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@example.com",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, env=env
    ).stdout.decode()


def make_repo(path: Path, files: int, total_mb: float) -> Path:
    """A repository of ``files`` files, ``total_mb`` MB in all, in one commit."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    size = int(total_mb * 1024 * 1024 / files)
    line = b"x" * 63 + b"\n"
    body = (line * (size // 64 + 1))[:size]
    for i in range(files):
        sub = path / f"pkg{i // 100:03d}"
        sub.mkdir(exist_ok=True)
        (sub / f"mod{i:05d}.py").write_bytes(b"# %d\n" % i + body)
    (path / "target.txt").write_text("first line\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "generated")
    return path


def tasks_run_command(repo: Path, objective: str, metadata: dict, *verify: str) -> list[str]:
    """`worker-bridge tasks run` with the mock worker, as a command line (JSON output)."""
    cmd = [str(Path(sys.executable).parent / "worker-bridge"), "tasks", "run", "--json"]
    cmd += ["--repo", str(repo), "--worker", "mock", "--objective", objective]
    cmd += ["--metadata-json", json.dumps(metadata)]
    for command in verify:
        cmd += ["--verify", command]
    return cmd


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass(frozen=True)
class Usage:
    """What one run cost the host: wall time, CPU time (user + system) of the processes it
    waited for, and the largest resident set among them."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float | None = None


def run_process(cmd: list[str], env: dict[str, str]) -> tuple[Usage, str]:
    """Run ``cmd`` to its end: its usage (its own and its waited-for children's CPU, from
    wait4, so nothing else the bench does is counted), its peak memory and its stdout."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        stdout = out.read().decode()
    cpu = usage.ru_utime + usage.ru_stime
    return Usage(wall, cpu, round(usage.ru_maxrss / 1024, 1)), stdout


def measured(fn: Callable[[], object], *, in_process: bool = False) -> tuple[Usage, object]:
    """Call ``fn``: its wall time and the CPU time of the processes it ran and waited for (a
    floor's git and docker CLI), plus this process's own when ``in_process`` (the library)."""
    kinds = [resource.RUSAGE_CHILDREN] + ([resource.RUSAGE_SELF] if in_process else [])

    def cpu() -> float:
        return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, kinds))

    c0, t0 = cpu(), time.perf_counter()
    value = fn()
    return Usage(time.perf_counter() - t0, cpu() - c0), value
