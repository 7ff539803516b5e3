"""Typed records: a new task as creation hands it to the store (`NewTask`), a task as the store
keeps it (`TaskRecord`) with its error, verification and changed files, the task result the
facade returns (`TaskResult`), and a job as stored and returned (`JobRecord`, `JobResult`). The
other documents stored inside them are bridge/documents.py's. Dicts appear only at the CLI, MCP
and JSON edges (`TaskResult.document()`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SkipValidation, model_serializer, model_validator

from bridge.config.profiles import AppliedProfile
from bridge.config.settings import Config, LimitDefaults
from bridge.documents import (
    BinaryNote,
    CircuitDoc,
    EnvironmentDoc,
    HeldOutcome,
    IntegrationStep,
    JobFindings,
    JobSpec,
    JobSummary,
    Ordering,
    RankedCandidate,
    RequestDoc,
    ReviewRound,
    Skipped,
    StoredDoc,
    UsageDoc,
    WorkerExit,
)
from bridge.errors import RecordUnreadable
from bridge.models import Status, TaskSpec

Parsed = TypeVar("Parsed")


class ErrorInfo(StoredDoc):
    kind: str
    message: str


class CommandResult(StoredDoc):
    """One verification command as it really ran (exit status and duration from the engine)."""

    command: str
    exit_code: int | None = None
    duration_s: float | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    # passed | failed | timed_out | out_of_memory | over_limit | not_run
    status: str | None = None
    note: str | None = None  # why the bridge stopped it, when it did

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and self.status in (None, "passed")


class VerificationDoc(StoredDoc):
    ok: bool | None = None
    image: str | None = None
    commands: list[CommandResult] = Field(default_factory=list)
    environment: EnvironmentDoc | None = None  # None: the generic image


class ChangedFile(StoredDoc):
    path: str
    change: str
    from_: str | None = Field(None, alias="from")
    binary: SkipValidation[BinaryNote] | None = None  # git shows it as binary

    @model_serializer(mode="wrap")
    def _without_empty_from(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        data.pop("from_", None)
        if self.from_ is not None:
            data["from"] = self.from_
        else:
            data.pop("from", None)
        if self.binary is None:
            data.pop("binary", None)
        return data


class NewTask(BaseModel):
    """A task creation has checked, as `Store.insert_task` writes it (status `created`, turn 0):
    the spec exactly as it will run (its type's profile applied), the repository's top level,
    the base commit the ref resolved to, and the configuration its runner will use: ``config``,
    the ``limits`` that apply (config's under the spec's) and the ``profile`` applied. A job's
    task also names its job, role and slot."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    spec: TaskSpec
    repository: str
    base_commit: str
    config: Config
    limits: LimitDefaults
    profile: AppliedProfile | None = None
    job_id: str | None = None
    job_role: str | None = None
    job_label: str | None = None


class _StoredRow(BaseModel):
    """A record read from a store row: NULL columns are absent, so the fields' defaults apply."""

    @model_validator(mode="before")
    @classmethod
    def _from_row(cls, row: Any) -> Any:
        if isinstance(row, dict):
            row = {k: v for k, v in row.items() if v is not None}
        return row


class TaskRecord(_StoredRow):
    """One row of the tasks table, typed. `spec` is exactly what runs (never redacted);
    `config` is the configuration recorded at creation, which the task's runner uses. Both
    are parsed on first use (listing many tasks needs neither), as `changed_files` is."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    task_id: str
    status: Status
    worker: str
    objective: str
    repository: str
    base_ref: str | None = None
    base_commit: str | None = None
    priority: int = 50
    idempotency_key: str | None = None
    spec_doc: dict[str, Any] = Field(alias="spec")
    config_doc: dict[str, Any] = Field(default_factory=dict, alias="config")
    created_at: str
    updated_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    phase: str | None = None
    summary: str | None = None
    error: ErrorInfo | None = None
    verification: VerificationDoc | None = None
    # Parsed on first use too: 100,000 changed files took 0.3 s to validate at every load
    # (accept, `tasks show`), where accept and most reads need none of them.
    changed_files_doc: list[Any] = Field(default_factory=list, alias="changed_files")
    timings: dict[str, float] = Field(default_factory=dict)
    snapshot_commit: str | None = None
    branch: str | None = None
    worktree: str | None = None
    container_id: str | None = None
    turn: int = 0
    runner_id: str | None = None
    deadline_at: float | None = None
    worker_exit: WorkerExit | None = None
    pruned_at: str | None = None
    follow_ups: list[str] = Field(default_factory=list)
    dropped: list[dict[str, str]] = Field(default_factory=list)
    usage: SkipValidation[UsageDoc | None] = None
    session_id: str | None = None
    worker_node: str | None = None
    verify_node: str | None = None
    job_id: str | None = None
    job_role: str | None = None
    job_label: str | None = None
    held_outcome: SkipValidation[HeldOutcome | None] = None

    @cached_property
    def spec(self) -> TaskSpec:
        return self._parsed(lambda: TaskSpec.model_validate(self.spec_doc))

    @cached_property
    def changed_files(self) -> list[ChangedFile]:
        return self._parsed(
            lambda: [ChangedFile.model_validate(entry) for entry in self.changed_files_doc]
        )

    @cached_property
    def config(self) -> Config:
        data = {k: v for k, v in self.config_doc.items() if k != "effective_limits"}
        return self._parsed(lambda: Config.from_record({"home": "/", **data}))

    @cached_property
    def limits(self) -> LimitDefaults:
        recorded = self.config_doc.get("effective_limits")
        if not recorded:
            return self.config.limits
        return self._parsed(lambda: LimitDefaults.model_validate(recorded))

    def _parsed(self, parse: Callable[[], Parsed]) -> Parsed:
        """A column read on first use; RecordUnreadable when it does not read (ConfigError
        and pydantic's ValidationError are ValueErrors), rather than a traceback or an error
        about the caller's own config.yaml."""
        try:
            return parse()
        except ValueError as exc:
            raise RecordUnreadable.of(f"Task {self.task_id}", exc) from exc

    @property
    def profile(self) -> AppliedProfile | None:
        """The task type's profile as applied at creation: its type and the spec fields it
        filled (bridge/config/profiles.py); None for a task without a type."""
        return self.config_doc.get("task_profile")

    @property
    def follow_up_message(self) -> str | None:
        """The message of the current turn (turn N uses follow_ups[N-1]); None on turn 0."""
        n = self.turn
        return self.follow_ups[n - 1] if 0 < n <= len(self.follow_ups) else None


class TaskResult(BaseModel):
    """The task result of the contract: what `tasks show --json`, `worker_status` and the
    library return. Text in it is redacted."""

    task_id: str
    status: Status
    worker: str
    objective: str
    summary: str | None = None
    changed_files: list[ChangedFile] = Field(default_factory=list)
    dropped: list[dict[str, str]] = Field(
        default_factory=list,
        description="What the snapshot left out of the worker's files, and why.",
    )
    verification: VerificationDoc | None = None
    artifacts: dict[str, str] = Field(default_factory=dict)
    error: ErrorInfo | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    session_id: str | None = None
    usage: SkipValidation[UsageDoc | None] = None
    worker_node: str | None = Field(
        None, description="The cluster's node the worker's last turn ran on; null on one host."
    )
    verify_node: str | None = Field(
        None, description="The cluster's node the checks ran on; null on one host."
    )
    repository: str
    base_commit: str | None = None
    branch: str | None = None
    phase: str | None = None
    created_at: str
    updated_at: str | None = Field(None, description="When the task's record last changed.")
    finished_at: str | None = None
    job_id: str | None = Field(None, description="The job this task is part of, if any.")
    job_role: str | None = Field(None, description="Its role there: candidate, judge...")
    profile: SkipValidation[AppliedProfile | None] = Field(
        None,
        description="The task type's profile: {type, filled: the spec fields it filled, "
        "because the caller left them unset}; null without a type.",
    )
    requests: SkipValidation[list[RequestDoc]] = Field(
        default_factory=list,
        description="What the worker asked for: request_id, kind (network, paths, question), "
        "detail, status (pending, approved, denied, answered, expired), at; answer with "
        "`worker-bridge tasks answer` / worker_answer while the status is pending.",
    )
    allowlist: list[str] = Field(
        default_factory=list,
        description="Names the task's proxy lets through: network.domains and approved names.",
    )
    approved_paths: list[str] = Field(
        default_factory=list,
        description="Protected paths this task was allowed to change (approved path requests).",
    )

    def document(self) -> dict[str, Any]:
        """The JSON document (for the CLI, the MCP server and files)."""
        return self.model_dump(mode="json", by_alias=True)


class AcceptResult(BaseModel):
    """What accepting a task did: the files written, or why nothing was (``kind``: `status`,
    `unverified`, `conflict`, `symlink_escape`, `verification_failed`, `protected_path`)."""

    accepted: bool
    task_id: str
    applied: list[str] = Field(default_factory=list)
    reason: str | None = None
    kind: str | None = None
    head: str | None = Field(None, description="The HEAD the change was written on.")
    reverified: bool | None = Field(
        None,
        description="HEAD had moved past the task's base: true when the checks ran again on "
        "HEAD plus the change and passed, false when that was skipped (unverified on that "
        "HEAD); null when HEAD was still the base.",
    )
    verification: VerificationDoc | None = Field(None, description="The checks on HEAD.")

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class WorkerInfo(BaseModel):
    """One worker as `workers list` shows it: ``healthy`` means it can run a task here now
    (image present, and whatever else it needs, such as a credential); ``reason`` says why not."""

    name: str
    installed: bool
    healthy: bool
    image: str
    capabilities: list[str] = Field(default_factory=list)
    cli_version: str | None = Field(None, description="The CLI's version, from its image.")
    reason: str | None = None
    circuit: SkipValidation[CircuitDoc] = Field(
        default_factory=lambda: CircuitDoc(state="closed"),
        description="Its circuit breaker (bridge/workers/circuit.py): state (closed, open, "
        "half_open, disabled), failures and their kinds, retry_at (when an open one is tried "
        "again) and probe_task (the one task trying it).",
    )

    @model_serializer(mode="wrap")
    def _without_empty_reason(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for key in ("reason", "cli_version"):  # shown only when there is one
            if data.get(key) is None:
                data.pop(key, None)
        return data

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Event(BaseModel):
    """One entry of a task's log (`tasks logs`, `worker_logs`): ids increase per store."""

    event_id: int
    task_id: str
    kind: str
    at: str
    data: dict[str, Any] = Field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class EventPage(BaseModel):
    """Events after a cursor, and the cursor to pass next (the last id, or the one given)."""

    events: list[Event]
    next_after: int

    def document(self) -> dict[str, Any]:
        return {"events": [e.document() for e in self.events], "next_after": self.next_after}


class JobRecord(_StoredRow):
    """One row of the jobs table, typed: ``spec`` holds the job's arguments (`task`: the task
    spec its tasks start from, and the kind's own keys), ``config`` the configuration recorded
    at creation (its coordinator's), ``result`` what the coordinator found so far."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    kind: str
    status: str
    repository: str
    spec: SkipValidation[JobSpec]
    config_doc: dict[str, Any] = Field(default_factory=dict, alias="config")
    result: SkipValidation[JobFindings] = Field(default_factory=lambda: JobFindings())
    error: ErrorInfo | None = None
    created_at: str
    updated_at: str | None = None
    finished_at: str | None = None
    runner_id: str | None = None

    @cached_property
    def config(self) -> Config:
        return Config.from_record({"home": "/", **self.config_doc})


class JobTask(BaseModel):
    """One task of a job, as the job result lists it."""

    task_id: str
    role: str
    label: str | None = None
    worker: str
    status: Status
    phase: str | None = None


class JobResult(BaseModel):
    """The job result of the contract: what `jobs show --json`, `worker_job_status` and the
    library return. For compete: the ranked ``candidates`` (each with `eligible`, `reasons[]`
    and the figures ranked on), the ``ordering`` (deterministic, and the judge's when asked) and
    the ``winner``; for review: the ``rounds``."""

    job_id: str
    kind: str
    status: str
    repository: str
    objective: str
    tasks: list[JobTask] = Field(default_factory=list)
    candidates: SkipValidation[list[RankedCandidate]] = Field(default_factory=list)
    ordering: SkipValidation[Ordering] = Field(default_factory=lambda: Ordering())
    winner: str | None = None
    rounds: SkipValidation[list[ReviewRound] | list[IntegrationStep]] = Field(default_factory=list)
    stopped: str | None = Field(
        None,
        description="Why a review ended: approved, no new findings, round limit, or a failure.",
    )
    summary: SkipValidation[JobSummary] = Field(
        default_factory=lambda: JobSummary(candidates=0, eligible=0, judge=None)
    )
    skipped: SkipValidation[list[Skipped]] = Field(
        default_factory=list,
        description="Workers the job did not use because their circuit breaker refused them: "
        "{worker, role, reason} (and the slot's label when it was refused mid-job).",
    )
    error: ErrorInfo | None = None
    created_at: str
    finished_at: str | None = None

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
