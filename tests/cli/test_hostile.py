"""The CLI where a worker has been: a `bridge` package, `sitecustomize.py`, `usercustomize.py`
or a `.pth` in the folder a command runs in (a repository's own, or what a worker wrote and the
user accepted) is never imported by `worker-bridge` nor by the detached runner it starts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support.cli import CLI
from support.tasks import task_flags, wait_until_done


def run(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    return subprocess.run(
        [*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=240
    )


def test_a_bridge_package_where_a_command_runs_is_never_imported(
    workdir, home, repo, cli, docker_images
):
    planted = workdir / "planted"
    marker = workdir / "imported"
    for package in ("bridge", "bridge/pipeline", "bridge/cli"):
        (planted / package).mkdir(parents=True)
        (planted / package / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    (planted / "bridge/pipeline/__main__.py").write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    flags = task_flags(repo, "x", metadata={"mock": {"script": "echo a > a.txt"}})
    created = run(home, planted, "tasks", "create", *flags)
    assert created.returncode == 0, created.stderr
    task_id = created.stdout.strip()
    started = run(home, planted, "tasks", "start", task_id)  # a detached runner
    assert started.returncode == 0, started.stderr
    assert wait_until_done(cli, task_id)["status"] == "succeeded"
    assert not marker.exists()


def test_what_a_worker_plants_and_the_user_accepts_is_never_run_by_later_commands(
    workdir, home, repo, docker_images
):
    """The worker also leaves a FIFO, a link, a name that is not UTF-8 and a 2 MB line beside
    its Python: the FIFO never arrives, the link arrives as a link, the name as its bytes."""
    marker = workdir / "imported"
    payload = f"open({str(marker)!r}, 'a').write('x')"
    script = (
        "mkdir -p bridge/cli && "
        + " && ".join(
            f'echo "{payload}" > {name}'
            for name in (
                "bridge/__init__.py",
                "bridge/cli/__init__.py",
                "sitecustomize.py",
                "usercustomize.py",
            )
        )
        + f' && echo "import os; {payload}" > evil.pth'
        + " && mkfifo fifo && ln -s evil.pth link"
        + " && printf x > \"$(printf 'caf\\351.txt')\""
        + " && head -c 2000000 /dev/zero | tr '\\0' a > long.txt"
    )
    flags = task_flags(repo, "plant", verify=("true",), metadata={"mock": {"script": script}})
    proc = run(home, repo, "tasks", "run", "--json", *flags)
    result = json.loads(proc.stdout)
    assert result["status"] == "succeeded", result["error"]
    arrived = {c["path"] for c in result["changed_files"]}
    assert "fifo" not in arrived and "fifo" in {d["path"] for d in result["dropped"]}
    accepted = run(home, repo, "tasks", "accept", result["task_id"])
    assert accepted.returncode == 0, accepted.stderr
    assert (repo / "bridge" / "cli" / "__init__.py").exists()
    assert (repo / "caf\udce9.txt").read_bytes() == b"x"
    assert not (repo / "fifo").exists()
    assert os.readlink(repo / "link") == "evil.pth"  # a link stays a link (one out is refused)
    for args in (("tasks", "list"), ("tasks", "show", result["task_id"]), ("--help",)):
        later = run(home, repo, *args)
        assert later.returncode == 0, later.stderr
    assert not marker.exists(), "the worker's Python ran on the host"
