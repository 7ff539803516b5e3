"""Throwaway git repositories for the tests: git run with a fixed identity, the small committed
project the `repo` fixture gives every test, and bare ones beside it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

IDENTITY = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def git(repo: Path, *args: str, check: bool = True) -> str:
    """`git -C REPO ARGS...` as the test identity; its stdout (fails the test on an error)."""
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, env={**os.environ, **IDENTITY}
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"git {args} failed: {proc.stderr.decode()}")
    return proc.stdout.decode()


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)


def write_files(root: Path, files: dict[str, str]) -> None:
    """Write FILES (path -> text) under ROOT, making the folders they need."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def commit_files(repo: Path, files: dict[str, str], message: str) -> None:
    """Write FILES (path -> text) and commit them alone."""
    for rel, text in files.items():
        (repo / rel).write_text(text)
    git(repo, "add", "--", *files)
    git(repo, "commit", "-qm", message)


def calc_repo(path: Path) -> Path:
    """A small committed repository at PATH: a module, its test, a .gitignore, a README."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (path / "tests").mkdir()
    (path / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    (path / ".gitignore").write_text("*.log\n__pycache__/\n")
    (path / "README.md").write_text("# demo\n")
    commit_all(path, "initial")
    return path


def make_repo(workdir: Path, name: str) -> Path:
    """Another small committed repository (a README only) next to the `repo` fixture."""
    path = workdir / name
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text(f"# {name}\n")
    commit_all(path, "initial")
    return path
