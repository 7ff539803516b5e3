"""Shared helpers: a generated repository, timing, medians and percentiles."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
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
