"""Creating a task: everything a spec is checked against before a row is written (the spec,
the worker and its metadata, the network and routes, the repository, its scope and base ref,
the images it names, its environment), and the record the store writes with the effective
configuration. The spec is validated once, into the `TaskSpec` the record carries; the
repository is opened once, as the one `Git` every check reads it through. Nothing is allocated
for a rejected spec; each refusal is one sentence naming what is wrong. The worker's circuit
breaker has the last word, in the transaction that writes the row."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from bridge.config.profiles import AppliedProfile, apply_profile, fill_profile
from bridge.config.settings import Config
from bridge.events import TaskCreated
from bridge.gateway.policy import check_network
from bridge.models import TaskSpec, parse_spec
from bridge.records import NewTask, TaskRecord
from bridge.sandbox import Sandbox
from bridge.sandbox.host_paths import require_repository
from bridge.scope import RepositoryScope
from bridge.store import Store
from bridge.workers import get_worker
from bridge.workers.circuit import admission
from bridge.workspace.git import Git, open_repository
from bridge.workspace.worktree import check_disjoint


def typed_spec(
    config: Config, given: Mapping[str, Any] | TaskSpec
) -> tuple[TaskSpec, AppliedProfile | None]:
    """The spec, its type's profile filling what the caller left unset (bridge/config/
    profiles.py), validated once; and what the profile filled. A document is filled before it
    is validated (a field left out or null is unset); a `TaskSpec` counts only the fields it
    set."""
    if isinstance(given, TaskSpec):
        # A caller's model may have been changed after it was made (pydantic models are
        # mutable): validated again from the fields it set, and carried as our own copy.
        return fill_profile(config, parse_spec(given.model_dump(mode="json", exclude_unset=True)))
    filled, profile = apply_profile(config, dict(given))
    return parse_spec(filled), profile


def new_task_row(
    config: Config,
    sandbox: Sandbox,
    scope: RepositoryScope,
    spec: Mapping[str, Any] | TaskSpec,
) -> tuple[NewTask, TaskCreated]:
    """The record of a new task and its `task.created` event, or InvalidSpec."""
    parsed, profile = typed_spec(config, spec)
    worker = get_worker(config, parsed.worker)
    worker.check_metadata(parsed.metadata, config)
    check_network(config, parsed, worker.routes(parsed.metadata, config))
    git = open_repository(parsed.workspace.repository)
    repo = git.cwd
    check_disjoint(config.home, repo)
    scope.check_new(repo)
    require_repository(repo)  # in a container: at the same path as on the host?
    base_commit = git.resolve_commit(parsed.workspace.base_ref)
    from bridge.environments.task import check_environment

    check_environment(config, sandbox, parsed, git, base_commit, worker)
    limits = config.limits.model_copy(update=parsed.limits.model_dump(exclude_none=True))
    task = NewTask(
        task_id=os.urandom(6).hex(),
        spec=parsed,
        repository=str(repo),
        base_commit=base_commit,
        config=config,
        limits=limits,
        profile=profile,
    )
    event = TaskCreated(worker=parsed.worker, repository=str(repo), base_commit=base_commit)
    if profile is not None:
        event["profile"] = profile
    return task, event


def record_task(
    store: Store, config: Config, task: NewTask, event: TaskCreated
) -> tuple[str, bool]:
    """Write a new task (see Store.insert_task), admitted by its worker's circuit breaker in
    the same transaction: CircuitOpen, and nothing written, when it refuses."""
    return store.insert_task(task, event, admit=admission(store, config, task))


def recheck_permissions(
    config: Config, sandbox: Sandbox, record: TaskRecord, *, worker_turn: bool
) -> None:
    """Before a verb that runs more of a task (another worker turn, a start, accept's checks):
    what the owner allows now still allows it. The task runs with the configuration recorded
    at its creation, so without this an owner's `allow_mock_routes: false` or a narrowed
    `allowed_images` would not reach tasks made before.

    Only what the owner's configuration decides is asked again: the worker (still one here)
    and its metadata (its mock routes, say) against the configuration now, and the images the
    task names against the image patterns now (the definition read as the task will run it:
    with its recorded configuration, at its base commit). The images are checked every time,
    even when the patterns are the ones recorded: a row written by an earlier version may have
    been checked by fewer rules (before the Dockerfile's own base images were). What no
    setting changes (the spec's shape, the repository, the base commit) is not checked again,
    and neither is what the engine holds: the runner finds that out."""
    spec = record.spec
    worker = get_worker(config, record.worker)
    if worker_turn:
        worker.check_metadata(spec.metadata, config)
    recorded = record.config
    from bridge.environments.task import check_images

    git = Git(record.repository)
    check_images(config, recorded, spec, git, record.base_commit or "HEAD")
