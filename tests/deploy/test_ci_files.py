"""The CI files we ship for building the images (.github/workflows/images.yml, and the GitLab
job in docs/ci.md) are valid YAML and name only steps that exist: every worker-bridge command
in them parses with our own CLI, and every image they build is one we have."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from bridge.cli import build_parser
from bridge.sandbox.images import available_targets

ROOT = Path(__file__).resolve().parents[2]
ACTIONS = {"actions/checkout@v4", "actions/setup-python@v5"}


def _commands(script: str, substitutions: dict[str, str]) -> list[list[str]]:
    """The worker-bridge command lines of a shell script (folded lines joined)."""
    for name, value in substitutions.items():
        script = script.replace(name, value)
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("worker-bridge "):
            found.append(shlex.split(line)[1:])
    return found


def _check(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)  # SystemExit (a failed test) when it does not parse
    for name in getattr(args, "names", None) or []:
        assert name in available_targets(), name


def test_the_github_workflow_builds_and_smokes_every_worker_image():
    workflow = yaml.safe_load((ROOT / ".github/workflows/images.yml").read_text())
    job = workflow["jobs"]["image"]
    images = job["strategy"]["matrix"]["image"]
    assert set(images) == set(available_targets()) - {"base", "verify"}
    steps = job["steps"]
    assert {s["uses"] for s in steps if "uses" in s} <= ACTIONS
    commands = []
    for image in images:
        for step in steps:
            if "run" in step:
                commands += _commands(step["run"], {"${{ matrix.image }}": image})
    assert commands and any("--smoke" in c for c in commands)
    for argv in commands:
        _check(argv)


def test_the_gitlab_job_in_the_docs_is_valid_and_uses_real_commands():
    text = (ROOT / "docs/ci.md").read_text()
    job = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    images = job["images"]["parallel"]["matrix"][0]["IMAGE"]
    assert set(images) == set(available_targets()) - {"base", "verify"}
    script = "\n".join(job[".image"]["script"])
    commands = [c for image in images for c in _commands(script, {'"$IMAGE"': image})]
    assert any("--smoke" in c for c in commands)
    for argv in commands:
        _check(argv)
