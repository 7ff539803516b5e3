"""The floor: the least work a task needs, done by hand with git and `docker run`.

worktree add → docker run (base image, network none, worktree bind-mounted, append a line) →
git diff --binary on the host → docker run (read-only checkout, one cheap verify command) →
worktree remove.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from bench.common import git


def run_floor(repo: Path, scratch: Path, image: str, verify_cmd: str) -> float:
    import time

    t0 = time.perf_counter()
    name = uuid.uuid4().hex[:10]
    worktree = scratch / f"floor-{name}"
    git(repo, "worktree", "add", "-q", "-b", f"floor/{name}", str(worktree), "HEAD")
    docker = ["docker", "run", "--rm", "--network", "none", "--label", "io.worker-bridge.bench=1"]
    subprocess.run(
        [
            *docker,
            "-v",
            f"{worktree}:/workspace",
            "-w",
            "/workspace",
            image,
            "sh",
            "-c",
            "echo appended >> target.txt",
        ],
        check=True,
        capture_output=True,
    )
    git(worktree, "add", "-A")
    git(worktree, "diff", "--binary", "--cached", "HEAD")
    subprocess.run(
        [
            *docker,
            "-v",
            f"{worktree}:/workspace:ro",
            "-w",
            "/workspace",
            image,
            "sh",
            "-c",
            verify_cmd,
        ],
        check=True,
        capture_output=True,
    )
    git(repo, "worktree", "remove", "--force", str(worktree))
    elapsed = time.perf_counter() - t0
    git(repo, "branch", "-q", "-D", f"floor/{name}")
    return elapsed
