"""Tasks as the tests write and drive them: a spec file, the mock worker's spec, a task as the
CLI's flags, and the CLI's `tasks run` / `tasks create` / `tasks logs` read back as JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from support.waiting import poll

from bridge.config.settings import Config
from bridge.models import TaskSpec, Workspace
from bridge.records import NewTask
from bridge.store.jobs import NewJob

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "accepted", "rejected"}


def new_task(
    task_id: str,
    *,
    objective: str = "o",
    repository: str = "/r",
    idempotency_key: str | None = None,
) -> NewTask:
    """A task as creation hands it to the store, without creation's checks: for tests of the
    store itself (mock worker, a made-up repository and base commit, a bare configuration)."""
    spec = TaskSpec(
        objective=objective,
        worker="mock",
        workspace=Workspace(repository=repository),
        idempotency_key=idempotency_key,
    )
    config = Config.from_record({"home": "/h"})
    return NewTask(
        task_id=task_id,
        spec=spec,
        repository=repository,
        base_commit="0" * 40,
        config=config,
        limits=config.limits,
    )


def new_job(job_id: str, *, repository: str = "/r", config: Config | None = None) -> NewJob:
    """A compete job as its maker hands it to the jobs table, without the checks: for tests
    of the table and of what reads it (a bare configuration unless given)."""
    config = config or Config.from_record({"home": "/h"})
    return NewJob(job_id=job_id, kind="compete", repository=repository, spec={}, config=config)


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(json.dumps(spec))
    return path


def bare_spec(repo: Path, **extra) -> dict:
    """A spec naming only the mock worker, the objective "x" and REPO (and EXTRA): what a test
    of creation, scope or refusal needs, with no script to run."""
    return {"objective": "x", "worker": "mock", "workspace": {"repository": str(repo)}, **extra}


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


def task_flags(
    repo: Path,
    objective: str,
    *,
    worker: str = "mock",
    verify: tuple[str, ...] = (),
    metadata: dict | None = None,
) -> list[str]:
    """A task as `tasks run`/`tasks create` flags instead of a spec file: REPO, OBJECTIVE, the
    worker, each verification command and the metadata (the mock's script: {"mock": ...})."""
    flags = ["--repo", str(repo), "--worker", worker, "--objective", objective]
    for command in verify:
        flags += ["--verify", command]
    if metadata is not None:
        flags += ["--metadata-json", json.dumps(metadata)]
    return flags


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


def start_spec(cli, workdir: Path, spec: dict, env: dict | None = None) -> str:
    """`tasks create --spec` then `tasks start` (a detached runner); the task's id."""
    path = write_spec(workdir / f"spec-{os.urandom(3).hex()}.json", spec)
    created = cli("tasks", "create", "--spec", str(path), env=env)
    assert created.code == 0, created.stderr
    task_id = created.stdout.strip()
    started = cli("tasks", "start", task_id, env=env)
    assert started.code == 0, started.stderr
    return task_id


def show_task(cli, task_id: str, env: dict | None = None) -> dict[str, Any]:
    """`tasks show --json`: the task's result as it stands."""
    res = cli("tasks", "show", task_id, "--json", env=env)
    assert res.code == 0, res.stderr
    return res.json()


def wait_until_done(
    cli, task_id: str, env: dict | None = None, deadline_s: float = 90
) -> dict[str, Any]:
    """`tasks show`, polled until the task is in a terminal status; its result."""
    return poll(
        lambda: (r := show_task(cli, task_id, env))["status"] in TERMINAL and r,
        f"task {task_id} to finish",
        deadline_s,
    )


def wait_for_event(
    cli, task_id: str, kind: str, env: dict | None = None, deadline_s: float = 60
) -> dict[str, Any]:
    """`tasks logs`, polled until the task has an event of KIND; the first such event."""
    return poll(
        lambda: next(iter(task_events(cli, task_id, env, kind)), None),
        f"event {kind} of task {task_id}",
        deadline_s,
    )
