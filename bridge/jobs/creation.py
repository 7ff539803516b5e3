"""Making a job: its arguments checked before anything is recorded (each refusal one sentence),
the base resolved once so that every task of it starts from the same commit, and its row with
the effective configuration its coordinator will run with. A worker whose circuit breaker is
not closed takes no task of a job: a compete skips it (saying so in its spec's `skipped`), any
other job is refused with the breaker's sentence."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from bridge.config.settings import Config
from bridge.documents import JobSpec, Skipped
from bridge.errors import CircuitOpen, InvalidSpec, TaskNotFound
from bridge.events import JobCreated
from bridge.jobs.slots import (
    candidate_spec,
    fanout_spec,
    implementer_spec,
    judge_spec,
    reviewer_spec,
    split_metadata,
)
from bridge.models import JobKind, JsonObject, Status, TaskSpec
from bridge.pipeline.creation import new_task_row
from bridge.records import NewTask, TaskRecord
from bridge.sandbox import Sandbox
from bridge.scope import RepositoryScope
from bridge.store.jobs import NewJob
from bridge.workers.circuit import Circuit, circuits_of
from bridge.workers.info import worker_infos


def _require_healthy(
    config: Config, sandbox: Sandbox, names: list[str], read_only: tuple[str, ...] = ()
) -> None:
    """Each named worker exists and can run here now (InvalidSpec naming the first that
    cannot, and why); those in ``read_only`` also have a read-only mode."""
    infos = {info.name: info for info in worker_infos(config, sandbox)}
    for name in dict.fromkeys(names):
        if not name:
            raise InvalidSpec("A worker name is empty; name the worker (`workers list`).")
        info = infos.get(name)
        if info is None:
            known = ", ".join(sorted(infos))
            raise InvalidSpec(f"Unknown worker '{name}'; known workers: {known}.")
        if not info.healthy:
            raise InvalidSpec(f"Worker '{name}' cannot run here now: {info.reason}")
        if name in read_only and "read_only" not in info.capabilities:
            raise InvalidSpec(
                f"Worker '{name}' has no read-only mode, so it cannot review; choose a worker "
                "whose capabilities (`workers list`) include read_only."
            )


def _refused(config: Config, names: list[str]) -> dict[str, Circuit]:
    """Those of the named workers whose circuit breaker takes no job task now (open, or
    half-open: only a single task tries a worker again), read from the store."""
    states = circuits_of(config, dict.fromkeys(n for n in names if n))
    return {name: circuit for name, circuit in states.items() if not circuit.admits}


def _require_admitted(config: Config, names: list[str]) -> None:
    """CircuitOpen, with its sentence, for the first named worker a breaker refuses."""
    for circuit in _refused(config, names).values():
        raise CircuitOpen(circuit.refusal(for_job=True), worker=circuit.worker)


def _skip_refused(
    config: Config, task: JsonObject, slots: list[str], judge: str | None
) -> tuple[list[str], str | None, list[Skipped]]:
    """A compete's slots and judge without the workers whose breaker refuses them (each
    candidate's `metadata.candidates` entry kept with its slot), and what was skipped, why;
    CircuitOpen when no candidate is left."""
    refused = _refused(config, [*slots, *([judge] if judge else [])])
    if not refused:
        return slots, judge, []
    kept = [n for n, worker in enumerate(slots) if worker not in refused]
    if not kept:
        if len(refused) == 1:
            (circuit,) = refused.values()
            raise CircuitOpen(circuit.refusal(for_job=True), worker=circuit.worker)
        raise CircuitOpen(
            "Every worker of this compete is refused by its circuit breaker: "
            + "; ".join(c.clause() for c in refused.values())
            + "; `worker-bridge workers reset NAME` closes one sooner.",
            worker=next(iter(refused)),
        )
    skipped = [
        Skipped(worker=w, role="candidate", reason=refused[w].refusal(for_job=True))
        for w in dict.fromkeys(slots)
        if w in refused
    ]
    if judge is not None and judge in refused:
        skipped.append(Skipped(worker=judge, role="judge", reason=refused[judge].refusal(True)))
        judge = None
    metadata = task.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("candidates"), list):
        given = metadata["candidates"]
        task["metadata"] = {
            **metadata,
            "candidates": [given[n] if n < len(given) else {} for n in kept],
        }
    return [slots[n] for n in kept], judge, skipped


def pinned_workspace(first: NewTask) -> dict[str, str]:
    """The workspace every task of a job starts from: the first task's, its base pinned to the
    commit the first task's ref resolved to."""
    return {**first.spec.workspace.model_dump(mode="json"), "base_ref": first.base_commit}


def compete_slots(workers: list[str], attempts: int, most: int = 8) -> list[str]:
    """The worker of each candidate: every named worker ``attempts`` times."""
    if attempts < 1:
        raise InvalidSpec("--attempts must be 1 or more.")
    asked = len(workers) * attempts  # counted before the list is built: --attempts 10**12
    if asked > most:
        raise InvalidSpec(
            f"A compete runs at most {most} candidates (config jobs.max_candidates); this asks "
            f"for {asked}."
        )
    slots = [w for w in workers for _ in range(attempts)]
    if len(slots) < 2:
        raise InvalidSpec(
            "A compete needs at least two candidates: name two workers, or give one worker "
            "with --attempts 2 or more."
        )
    return slots


def _task_document(task: Mapping[str, Any] | TaskSpec) -> JsonObject:
    """The task spec document a job's tasks start from (a copy: the caller's is not changed)."""
    return task.model_dump(mode="json") if isinstance(task, TaskSpec) else dict(task)


def _new_job(job_id: str, kind: JobKind, repository: str, spec: JobSpec, config: Config) -> NewJob:
    return NewJob(job_id=job_id, kind=str(kind), repository=repository, spec=spec, config=config)


def new_compete_row(
    config: Config,
    sandbox: Sandbox,
    scope: RepositoryScope,
    task: Mapping[str, Any] | TaskSpec,
    workers: list[str],
    attempts: int = 1,
    judge: str | None = None,
) -> tuple[NewJob, JobCreated]:
    """A new compete job and its `job.created` event, or InvalidSpec."""
    document = _task_document(task)
    workers = [w.strip() for w in workers if w and w.strip()]
    slots = compete_slots(workers, attempts, config.jobs.max_candidates)
    _, overrides, _ = split_metadata(document.get("metadata") or {})
    if len(overrides) > len(slots):
        raise InvalidSpec(
            f"metadata.candidates has {len(overrides)} entries for {len(slots)} candidates."
        )
    _require_healthy(config, sandbox, [*slots, *([judge] if judge else [])])
    slots, judge, skipped = _skip_refused(config, document, slots, judge)
    job_id = "job-" + os.urandom(5).hex()
    spec = JobSpec(task=document, workers=slots, judge=judge, skipped=skipped)
    # Every candidate's spec is checked as a task's would be, and the base pinned to one commit.
    first, _ = new_task_row(config, sandbox, scope, candidate_spec(spec, job_id, 0))
    document["workspace"] = pinned_workspace(first)
    for n in range(1, len(slots)):
        new_task_row(config, sandbox, scope, candidate_spec(spec, job_id, n))
    for asking in (1, 2) if judge else ():  # each asking's metadata checked now, not mid-job
        new_task_row(config, sandbox, scope, judge_spec(spec, job_id, asking, "rank"))
    job = _new_job(job_id, JobKind.COMPETE, first.repository, spec, config)
    event = JobCreated(
        kind="compete",
        workers=slots,
        judge=judge,
        repository=first.repository,
        base_commit=first.base_commit,
        skipped=skipped,
    )
    return job, event


def new_review_row(
    config: Config,
    sandbox: Sandbox,
    scope: RepositoryScope,
    task: Mapping[str, Any] | TaskSpec,
    worker: str,
    reviewer: str,
    rounds: int = 3,
) -> tuple[NewJob, JobCreated]:
    """A new review job and its `job.created` event, or InvalidSpec."""
    document = _task_document(task)
    most = config.jobs.max_rounds
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= most:
        raise InvalidSpec(
            f"--rounds must be between 1 and {most} (config jobs.max_rounds); it was {rounds}."
        )
    _require_healthy(config, sandbox, [worker, reviewer], read_only=(reviewer,))
    _require_admitted(config, [worker, reviewer])
    job_id = "job-" + os.urandom(5).hex()
    spec = JobSpec(task=document, worker=worker, reviewer=reviewer, rounds=rounds)
    first, _ = new_task_row(config, sandbox, scope, implementer_spec(spec, job_id))
    document["workspace"] = pinned_workspace(first)
    _check_reviewers(config, sandbox, scope, spec, job_id, first.base_commit)
    job = _new_job(job_id, JobKind.REVIEW, first.repository, spec, config)
    event = JobCreated(
        kind="review",
        worker=worker,
        reviewer=reviewer,
        rounds=rounds,
        repository=first.repository,
        base_commit=first.base_commit,
    )
    return job, event


def _check_reviewers(
    config: Config,
    sandbox: Sandbox,
    scope: RepositoryScope,
    spec: JobSpec,
    job_id: str,
    base_commit: str,
) -> None:
    """Every round's reviewer spec checked as a task's would be (its `metadata.reviewer` entry
    included), now rather than when the round comes; the base stands in for the snapshot."""
    given = (spec["task"].get("metadata") or {}).get("reviewer")
    entries = given if isinstance(given, list) else [given]
    if not all(entry is None or isinstance(entry, dict) for entry in entries):
        raise InvalidSpec(
            "metadata.reviewer must be an object (the reviewer's metadata) or a list of "
            "them, one per round."
        )
    for round_no in range(1, min(spec["rounds"], max(len(entries), 1)) + 1):
        new_task_row(
            config, sandbox, scope, reviewer_spec(spec, job_id, round_no, base_commit, "review")
        )


def new_fanout_row(
    config: Config,
    sandbox: Sandbox,
    scope: RepositoryScope,
    task: Mapping[str, Any] | TaskSpec,
    objectives: list[str],
) -> tuple[NewJob, JobCreated]:
    """A new fanout job (several objectives, one base) and its event."""
    document = _task_document(task)
    objectives = [o for o in objectives if o and o.strip()]
    if len(objectives) < 2:
        raise InvalidSpec("A fanout needs at least two objectives (--objective, repeated).")
    if len(objectives) > config.jobs.max_candidates:
        raise InvalidSpec(
            f"A fanout runs at most {config.jobs.max_candidates} objectives at once (config "
            "jobs.max_candidates)."
        )
    document.setdefault("objective", objectives[0])
    _require_healthy(config, sandbox, [document.get("worker") or "mock"])
    _require_admitted(config, [document.get("worker") or "mock"])
    job_id = "job-" + os.urandom(5).hex()
    spec = JobSpec(task=document, objectives=objectives)
    _, overrides, _ = split_metadata(document.get("metadata") or {})
    if len(overrides) > len(objectives):
        raise InvalidSpec(
            f"metadata.candidates has {len(overrides)} entries for {len(objectives)} objectives."
        )
    first, _ = new_task_row(config, sandbox, scope, fanout_spec(spec, job_id, 0))
    document["workspace"] = pinned_workspace(first)
    for n in range(1, len(objectives)):  # each part's own input, checked now, not mid-job
        new_task_row(config, sandbox, scope, fanout_spec(spec, job_id, n))
    job = _new_job(job_id, JobKind.FANOUT, first.repository, spec, config)
    event = JobCreated(kind="fanout", objectives=len(objectives), base_commit=first.base_commit)
    return job, event


def new_integrate_row(
    config: Config, sandbox: Sandbox, source_job: str, tasks: list[TaskRecord]
) -> tuple[NewJob, JobCreated]:
    """An integrate job over ``tasks`` (checked by the facade to be in scope), or
    InvalidSpec: each must be a verified task of ``source_job``, all on one repository and
    one base commit."""
    if not tasks:
        raise InvalidSpec("--tasks names no task; give the tasks to integrate, in order.")
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise InvalidSpec("--tasks names a task twice; name each once, in the order to apply.")
    for t in tasks:
        if t.job_id != source_job:
            raise TaskNotFound(f"Task {t.task_id} is not a task of job {source_job}.")
        if t.status != Status.SUCCEEDED or not (t.verification and t.verification.ok):
            raise InvalidSpec(
                f"Task {t.task_id} is {t.status} and not verified; integrate only succeeded, "
                "verified tasks."
            )
    if len({t.repository for t in tasks}) > 1:
        raise InvalidSpec("The tasks are on different repositories; integrate tasks of one.")
    if len({t.base_commit for t in tasks}) > 1:
        raise InvalidSpec(
            "The tasks start from different base commits; integrate tasks of one base."
        )
    _require_healthy(config, sandbox, ["mock"])
    _require_admitted(config, ["mock"])
    first = tasks[0]
    spec = JobSpec(
        task={**first.spec_doc, "objective": f"Integrate {', '.join(ids)}"},
        source_job=source_job,
        tasks=ids,
        snapshots=[t.snapshot_commit for t in tasks],
        repository=first.repository,
        base_commit=first.base_commit,
    )
    job_id = "job-" + os.urandom(5).hex()
    job = _new_job(job_id, JobKind.INTEGRATE, first.repository, spec, config)
    return job, JobCreated(kind="integrate", source_job=source_job, tasks=ids)
