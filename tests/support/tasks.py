"""Tasks as the tests write and drive them: a spec file, the mock worker's spec, and the CLI's
`tasks run` / `tasks logs` read back as JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "accepted", "rejected"}


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(json.dumps(spec))
    return path


def mock_task(repo: Path, mock: dict, *, verify: list[str] | None = None, **extra) -> dict:
    """A spec for the mock worker."""
    spec = {
        "objective": extra.pop("objective", "test task"),
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": verify or []},
        "metadata": {"mock": mock},
    }
    for key, value in extra.items():
        spec[key] = value
    return spec


def run_spec(
    cli, workdir: Path, spec: dict, env: dict | None = None, *extra: str, timeout: float = 600
) -> dict[str, Any]:
    """`tasks run --spec` to the end through the CLI; the task's result."""
    path = write_spec(workdir / f"spec-{os.urandom(3).hex()}.json", spec)
    res = cli("tasks", "run", "--spec", str(path), "--json", *extra, env=env, timeout=timeout)
    assert res.stdout.strip(), res.stderr
    return res.json()


def task_events(cli, task_id: str, env: dict | None = None, kind: str | None = None) -> list[dict]:
    """The task's event log through the CLI, or only its events of one KIND."""
    res = cli("tasks", "logs", task_id, "--json", env=env)
    assert res.code == 0, res.stderr
    found = res.json()["events"]
    return [e for e in found if kind is None or e["kind"] == kind]


def create_spec(cli, workdir: Path, spec: dict, env: dict | None = None):
    """`tasks create --spec --json` through the CLI; its CliResult (a refusal is a result)."""
    path = write_spec(workdir / f"spec-{os.urandom(3).hex()}.json", spec)
    return cli("tasks", "create", "--spec", str(path), "--json", env=env)
