"""Creating a task: everything a spec is checked against before a row is written (the spec,
the worker and its metadata, the network and routes, the repository, its scope and base ref,
the images it names, its environment), and the row itself with the effective configuration.
Nothing is allocated for a rejected spec; each refusal is one sentence naming what is wrong.
The worker's circuit breaker has the last word, in the transaction that writes the row."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bridge.config.profiles import apply_profile
from bridge.config.settings import Config
from bridge.gateway.policy import check_network
from bridge.models import Status, TaskSpec, parse_spec
from bridge.records import TaskRecord
from bridge.sandbox import Sandbox
from bridge.sandbox.host_paths import require_repository
from bridge.scope import RepositoryScope
from bridge.store import Store
from bridge.workers import get_worker
from bridge.workers.circuit import admission
from bridge.workspace.git import Git, repository_root
from bridge.workspace.worktree import check_disjoint


def new_task_row(
    config: Config, sandbox: Sandbox, scope: RepositoryScope, spec: dict[str, Any] | TaskSpec
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row of a new task and its `task.created` event, or InvalidSpec. The spec's type
    fills what it left unset first (bridge/config/profiles.py); the row records what it filled."""
    if isinstance(spec, TaskSpec):
        spec = spec.model_dump(exclude_unset=True)  # a field left at its default is unset
    spec, profile = apply_profile(config, spec)
    parsed = parse_spec(spec)
    worker = get_worker(config, parsed.worker)
    worker.check_metadata(parsed.metadata, config)
    check_network(config, parsed, worker.routes(parsed.metadata, config))
    repo = repository_root(parsed.workspace.repository)
    check_disjoint(config.home, repo)
    scope.check_new(repo)
    require_repository(repo)  # in a container: at the same path as on the host?
    base_commit = Git(repo).resolve_commit(parsed.workspace.base_ref)
    from bridge.environments.task import check_environment

    check_environment(config, sandbox, parsed, repo, base_commit, worker)
    limits = config.limits.model_dump()
    limits.update(parsed.limits.model_dump(exclude_none=True))
    effective = config.model_dump(mode="json")
    effective["effective_limits"] = limits
    effective["task_profile"] = profile
    row = {
        "task_id": os.urandom(6).hex(),
        "status": str(Status.CREATED),
        "worker": parsed.worker,
        "objective": parsed.objective,
        "repository": str(repo),
        "base_ref": parsed.workspace.base_ref,
        "base_commit": base_commit,
        "priority": parsed.priority,
        "idempotency_key": parsed.idempotency_key,
        "spec": parsed.model_dump(mode="json"),
        "config": effective,
    }
    event = {"worker": parsed.worker, "repository": str(repo), "base_commit": base_commit}
    if profile is not None:
        event["profile"] = profile
    return row, event


def record_task(
    store: Store, config: Config, row: dict[str, Any], event: dict[str, Any]
) -> tuple[str, bool]:
    """Write a new task's row (see Store.insert_task), admitted by its worker's circuit
    breaker in the same transaction: CircuitOpen, and nothing written, when it refuses."""
    return store.insert_task(row, event, admit=admission(store, config, row))


def recheck_permissions(
    config: Config, sandbox: Sandbox, record: TaskRecord, *, worker_turn: bool
) -> None:
    """Before a verb that runs more of a task (another worker turn, a start, accept's checks):
    what the owner allows now still allows it. The task runs with the configuration recorded
    at its creation, so without this an owner's `allow_mock_routes: false` or a narrowed
    `allowed_images` would not reach tasks made before."""
    spec = record.spec
    worker = get_worker(config, record.worker)
    if worker_turn:
        worker.check_metadata(spec.metadata, config)
    from bridge.environments.task import check_environment

    check_environment(
        config, sandbox, spec, Path(record.repository), record.base_commit or "HEAD", worker
    )
