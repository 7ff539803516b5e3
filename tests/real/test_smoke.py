"""`images build --smoke`: one real task per worker image built, each CLI against the scripted
model server, so a pipeline knows the images can do the job; a worker that cannot is named and
the command fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.real_workers import ensure_worker_image

pytestmark = pytest.mark.usefixtures("docker_images")


def smoke_leftovers() -> tuple[set[str], set[str]]:
    """The smoke state roots in /dev/shm, and the mounts under any of them."""
    roots = {p.name for p in Path("/dev/shm").glob("wb-smoke-*")}
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return roots, {m.split()[4] for m in mounts if "/wb-smoke-" in m.split()[4]}


def test_smoke_runs_a_task_in_each_image_built_and_cleans_up(cli, home, docker_images):
    ensure_worker_image(docker_images, "codex")
    before = smoke_leftovers()
    res = cli("images", "build", "mock", "codex", "--smoke", timeout=600)
    assert res.code == 0, res.stdout[-2000:] + res.stderr
    lines = [line for line in res.stdout.splitlines() if line.startswith("smoke ")]
    assert [line.split()[1:3] for line in lines] == [["mock", "ok"], ["codex", "ok"]], lines
    assert "verified, 2 model requests" in lines[1]
    assert not (home / "tasks").exists()  # each smoke task had a state root of its own
    # ... and nothing of it stays: its folder in /dev/shm, or its layered worktree's mount
    # (only this file runs smoke tasks, and its tests run one at a time).
    assert smoke_leftovers() == before


def test_a_worker_that_cannot_do_the_job_fails_the_smoke_naming_it(cli, home, docker_images):
    ensure_worker_image(docker_images, "codex")
    # A model slug Codex does not know: no apply_patch tool, so the file is never written.
    (home / "config.yaml").write_text("worker_settings:\n  codex: {model: no-such-model}\n")
    res = cli("images", "build", "codex", "--smoke", timeout=600)
    assert res.code == 1
    assert "smoke codex        FAILED" in res.stdout
    assert "the smoke task failed for codex" in res.stderr
