"""A `mount` command put first on PATH that refuses, or makes and then never finishes, the mounts
whose arguments contain a given text, and hands every other one to the real `mount`: how tests
make the kernel refuse one chosen layered checkout, or its mount hang, without touching others."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import pytest


def fake_mount(folder: Path, monkeypatch: pytest.MonkeyPatch, when: str, *, hang: bool = False):
    """Mounts whose arguments contain ``when`` are refused (exit 32, as the kernel's refusal
    reads), or with ``hang`` made and then left unfinished (the command sleeps on)."""
    real = shutil.which("mount")
    assert real is not None
    bin_dir = folder / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    refuse = 'echo "mount: refused by the test" >&2; exit 32'
    matched = f'{shlex.quote(real)} "$@"; exec sleep 600' if hang else refuse
    script = bin_dir / "mount"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *{shlex.quote(when)}*) {matched};; esac\n'
        f'exec {shlex.quote(real)} "$@"\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
