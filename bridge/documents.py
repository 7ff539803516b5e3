"""The JSON documents whose keys are ours, typed: what a task result or a job result holds as plain
JSON (the network usage, the requests, a circuit breaker's state; a job's candidates, rounds and
steps), what the jobs table stores (a job's spec and its result so far), what a prune reports,
and the stored documents read as models (a worker's exit, a request, a verification's
environment). The TypedDicts stay dicts at run time, so the documents and the library's results
keep their shape. A record that holds one does not validate it again (SkipValidation: our own
code wrote it, and a row an older version wrote must stay readable); `extra="allow"` keeps, when
pydantic dumps it, any key another version wrote."""

from __future__ import annotations

from typing import NotRequired

from pydantic import BaseModel, ConfigDict, Field, SkipValidation, with_config
from typing_extensions import TypedDict

from bridge.models import JsonObject

_KEEP = ConfigDict(extra="allow")


class StoredDoc(BaseModel):
    """A stored document read as a record: extra keys written by another version are kept, not
    refused."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


# -- a task's --------------------------------------------------------------------------------


@with_config(_KEEP)
class TokenCounts(TypedDict):
    input: int
    output: int


@with_config(_KEEP)
class UsageDoc(TypedDict):
    """What a task's gateways counted: requests, bytes each way, tokens by the model named."""

    requests: int
    bytes_up: int
    bytes_down: int
    tokens: dict[str, TokenCounts]


class EnvironmentDoc(StoredDoc):
    """The project environment verification ran in: where it comes from, its image, its cache
    key, what its setup did and the dependency files the worker changed (setup then ran again
    for the snapshot)."""

    source: str  # `image NAME` or `devcontainer PATH`
    image: str
    key: str | None = None
    setup: str  # none | cached | ran | ran_for_snapshot | failed_for_snapshot
    changed_files: list[str] = Field(default_factory=list)


@with_config(_KEEP)
class BinaryNote(TypedDict):
    """A changed file git shows as binary (a NUL in its first 8,000 bytes, or the repository's
    attributes): ``flagged`` when it is new, was text in the base or was renamed or copied
    there (the readable diff shows its text, escaped), ``holds_nul`` when it is flagged and its
    content holds a NUL there (the change made it binary: what `verification.allow_binary:
    false` refuses), and the lines it counts: its text's, added and removed, a line counted
    once per 80 bytes started."""

    flagged: bool
    holds_nul: bool
    lines_added: int
    lines_removed: int


@with_config(_KEEP)
class Coverage(TypedDict):
    """What one glob of a paths request would excuse: how many protected files of the base
    commit it matches, how many the worker's snapshot added that it matches, and the first of
    those paths (the added first)."""

    base: int
    added: int
    paths: list[str]


@with_config(_KEEP)
class RequestDetail(TypedDict, total=False):
    """What a request asks, by kind: network (host, port), paths (paths, reason, and what each
    glob covers; an int, the base's count alone, in a request an older version recorded),
    question (text, choices)."""

    host: str
    port: int
    paths: list[str]
    reason: str
    covers: dict[str, Coverage | int]
    text: str
    choices: list[str]


@with_config(_KEEP)
class RequestAnswer(TypedDict, total=False):
    """How a request was answered: a decision (approve, deny), a text, or why it was closed."""

    decision: str
    text: str
    reason: str


@with_config(_KEEP)
class AskedRequest(TypedDict):
    """The request block of a worker's final message, as read (bridge/asking.py)."""

    kind: str  # paths | question
    detail: RequestDetail


@with_config(_KEEP)
class RequestDoc(TypedDict):
    """One request as the task result shows it (redacted)."""

    request_id: str
    kind: str
    detail: RequestDetail
    status: str
    at: str
    attempts: NotRequired[int]  # network requests: the refused attempts counted
    answer: NotRequired[RequestAnswer]


@with_config(_KEEP)
class ErrorDoc(TypedDict):
    """A task's error as stored and shown (bridge/records.py's ErrorInfo, redacted)."""

    kind: str
    message: str


@with_config(_KEEP)
class HeldOutcome(TypedDict):
    """How the turn that left a task waiting for input would have ended (redacted): its status,
    its error and the result fields to write, kept until an answer or the input timeout."""

    status: str
    error: ErrorDoc | None
    fields: dict[str, object]


@with_config(_KEEP)
class CircuitDoc(TypedDict):
    """A worker's circuit breaker as shown (bridge/workers/circuit.py)."""

    state: str  # closed | open | half_open | disabled
    failures: NotRequired[int]
    kinds: NotRequired[dict[str, int]]
    retry_at: NotRequired[str | None]
    probe_task: NotRequired[str | None]


@with_config(_KEEP)
class ResetDoc(TypedDict):
    """What `workers reset` did: the worker's breaker is closed; ``before``, how it was."""

    worker: str
    state: str
    before: CircuitDoc


# What a built-in worker's failure sentence says when its CLI could not resume the session of
# the earlier turns (its files gone, say): the circuit breaker does not count that as a broken
# worker (bridge/workers/circuit.py), on a follow-up turn.
RESUME_FAILED = "could not resume its session"


class WorkerExit(StoredDoc):
    """How a worker turn ended; persisted on the task before its container is removed."""

    turn: int
    exit_code: int | None
    oom_killed: bool = False
    timed_out: bool = False
    summary: str = ""
    last_progress: str = ""
    over_limit: str | None = None  # why the bridge stopped it (the disk limit), one sentence
    failure: str | None = None  # the CLI's own account of why it failed, one sentence
    # The worker-bridge-request block of the final message, parsed from the whole message
    # (the summary above is cut for display), redacted; None: it holds none in the exact shape.
    request: SkipValidation[AskedRequest | None] = None


class RequestRecord(StoredDoc):
    """One request of a task (a row of the requests table): a network name the gateway
    refused, or the protected paths or question of the worker's final message."""

    request_id: str
    task_id: str
    kind: str  # network | paths | question
    detail: SkipValidation[RequestDetail] = Field(default_factory=lambda: RequestDetail())
    status: str  # pending | approved | denied | answered | expired
    at: str
    attempts: int = 1
    turn: int = 0
    expires_at: float | None = None
    answer: SkipValidation[RequestAnswer | None] = None  # as given (never shown unredacted)
    delivered_turn: int | None = None


# -- reclaiming disk ---------------------------------------------------------------------------


@with_config(_KEEP)
class Removal(TypedDict):
    """What a prune removes (or would): a task's workspace or artifacts, a leftover folder, a
    container, a cache entry, an image, a worker bundle... with why, and what it could not
    remove once applied."""

    kind: str
    target: str
    reason: str
    task_id: NotRequired[str | None]  # workspaces prune: the task it belonged to
    failed: NotRequired[list[str] | None]
    image: NotRequired[str | None]  # environments prune: the entry's image
    bytes: NotRequired[int]


@with_config(_KEEP)
class PruneReport(TypedDict):
    """`workspaces prune` and `environments prune`: whether it was applied, and each removal."""

    applied: bool
    actions: list[Removal]
    root: NotRequired[str]  # environments prune: the cache's folder


# -- a job's ---------------------------------------------------------------------------------


@with_config(_KEEP)
class Skipped(TypedDict):
    """A worker a job did not use because its circuit breaker refused it."""

    worker: str
    role: str
    reason: str
    label: NotRequired[str]  # the slot, when it was refused mid-job


@with_config(_KEEP)
class JobSpec(TypedDict, total=False):
    """A job's arguments as the jobs table keeps them: `task`, the task spec document its tasks
    start from (only the keys its caller set, so a type's profile fills the rest), and the
    kind's own keys: compete (workers, judge, skipped), review (worker, reviewer, rounds),
    fanout (objectives), integrate (source_job, tasks, snapshots, repository, base_commit)."""

    task: JsonObject
    workers: list[str]
    judge: str | None
    skipped: list[Skipped]
    worker: str
    reviewer: str
    rounds: int
    objectives: list[str]
    source_job: str
    tasks: list[str]
    snapshots: list[str | None]
    repository: str
    base_commit: str | None


@with_config(_KEEP)
class Check(TypedDict):
    """One verification command of a candidate, as ranked."""

    command: str
    exit_code: int | None
    passed: bool


@with_config(_KEEP)
class RankedCandidate(TypedDict):
    """A compete's candidate in the job result: its figures (bridge/jobs/ranking.py's
    Candidate), whether it may win, its place and the reasons for both."""

    task_id: str
    label: str
    worker: str
    status: str
    verification_ok: bool | None
    error_kind: str | None
    error_message: str | None
    changed_lines: int
    lines_added: int
    lines_removed: int
    files: int
    duration_s: float
    tokens: int
    checks: list[Check]
    paths: list[str]
    snapshot_commit: str | None
    eligible: bool
    rank: int | None
    reasons: list[str]
    judge_rank: NotRequired[int]


@with_config(_KEEP)
class Ordering(TypedDict, total=False):
    """A compete's orderings by task id: by our verification, and the judge's (None when it
    failed or disagreed with itself)."""

    deterministic: list[str]
    judge: list[str] | None


@with_config(_KEEP)
class JudgeAsking(TypedDict):
    task_id: str
    ranking: list[str] | None
    reasons: dict[str, str]
    problem: str | None


@with_config(_KEEP)
class Verdict(TypedDict):
    """What the judge's askings came to: the labels it was shown, each asking, and the agreed
    ordering (or the problem)."""

    labels: dict[str, str]
    askings: list[JudgeAsking]
    ordering: list[str] | None
    problem: str | None


@with_config(_KEEP)
class Finding(TypedDict):
    path: str | None
    line: int | None
    severity: str
    text: str


@with_config(_KEEP)
class ReviewRound(TypedDict):
    round: int
    implementer_turn: int
    verification_ok: bool | None
    changed_files: list[str]
    reviewer_task: str
    verdict: str | None
    findings: list[Finding]
    new_findings: int
    problem: str | None


@with_config(_KEEP)
class IntegrationStep(TypedDict):
    task_id: str
    step: int
    conflict: list[str]
    problem: NotRequired[str]
    integration_task: NotRequired[str]
    status: NotRequired[str]
    verification_ok: NotRequired[bool | None]


@with_config(_KEEP)
class Part(TypedDict):
    """A fanout's task and how it ended."""

    task_id: str
    status: str


@with_config(_KEEP)
class JobFindings(TypedDict, total=False):
    """What a job's coordinator found so far (the jobs table's `result`), by kind: compete
    (skipped, candidates, ordering, judge, winner), review (implementer, rounds, stopped,
    winner), fanout (parts, skipped), integrate (steps, winner)."""

    skipped: list[Skipped]
    candidates: list[RankedCandidate]
    ordering: Ordering
    judge: Verdict
    winner: str | None
    implementer: str
    rounds: list[ReviewRound]
    stopped: str | None
    steps: list[IntegrationStep]
    parts: list[Part]


@with_config(_KEEP)
class JobSummary(TypedDict):
    candidates: int
    eligible: int
    judge: str | None
