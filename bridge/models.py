"""The domain vocabulary: the task spec users submit, task statuses and their transition table.

Pydantic models at the boundary (specs come from JSON, CLI flags and MCP calls); every model
forbids unknown keys so a typo is an error that names the key.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bridge.errors import InvalidSpec

# A JSON object that comes from outside and whose keys are not ours to define: a task's
# `metadata`, a worker CLI's stream line, a devcontainer.json, an upstream's response. Data
# whose keys are ours gets a record (bridge/records.py) or a TypedDict instead.
JsonObject = dict[str, Any]


def json_object(value: object) -> JsonObject:
    """``value`` when it is a JSON object, else an empty one: for reading a nested key of
    outside JSON that may hold anything."""
    return value if isinstance(value, dict) else {}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Workspace(_Strict):
    repository: str = Field(description="Absolute path to a git work tree on the host.")
    base_ref: str = Field("HEAD", description="Commit-ish the task starts from.")


class Verification(_Strict):
    commands: list[str] = Field(default_factory=list, description="Shell commands run by sh -c.")
    image: str | None = Field(None, description="Verification image; default from config.")
    protected_paths: list[str] = Field(
        default_factory=list, description="Glob patterns the worker must not change."
    )
    allow_binary: bool | None = Field(
        None,
        description="Whether the change may make a file binary (a NUL byte in its first 8000 "
        "bytes, in a file new or text in the base): false fails the task (`binary_change`) "
        "before verification. Default: allowed for a task of its own, refused for a job's tasks.",
    )


class Limits(_Strict):
    timeout_seconds: int | None = Field(None, ge=1, description="One deadline for the whole task.")
    memory_mb: int | None = Field(None, ge=16)
    cpus: float | None = Field(None, gt=0)
    pids: int | None = Field(None, ge=16)
    disk_mb: int | None = Field(None, ge=1)
    file_mb: int | None = Field(None, ge=1)
    change_mb: int | None = Field(None, ge=1)
    files: int | None = Field(None, ge=100)
    log_mb: int | None = Field(None, ge=1)
    line_kb: int | None = Field(None, ge=1)
    secrets: int | None = Field(None, ge=10)
    input_timeout_seconds: int | None = Field(
        None, ge=1, description="How long a request or question waits for an answer."
    )


class Network(_Strict):
    mode: Literal["none", "allowlist"] = "none"
    domains: list[str] = Field(default_factory=list)
    on_refused: Literal["refuse", "ask"] | None = Field(
        None,
        description="What a refusal of a name not in `domains` does: `refuse`, or `ask` (it "
        "becomes a pending request the caller may approve; never for private, loopback or "
        "metadata addresses). Default: config gateway.on_refused.",
    )


class Environment(_Strict):
    """The project's toolchain for the worker and for verification (see docs/environments.md)."""

    image: str | None = Field(None, min_length=1, description="An image in this engine.")
    devcontainer: bool | str = Field(
        False, description="Read the repository's devcontainer.json (true) or this path to one."
    )
    setup: list[str] = Field(
        default_factory=list, description="Shell commands run once, in their own phase, cached."
    )
    setup_network: list[str] = Field(
        default_factory=list, description="Host names the setup may reach (through the gateway)."
    )
    cache_key_files: list[str] | None = Field(
        None, description="Files whose content keys the cache; default: manifests and lockfiles."
    )
    setup_timeout_seconds: int | None = Field(
        None, ge=1, description="Deadline of the whole setup; default from config."
    )

    @field_validator("setup")
    @classmethod
    def _commands_not_blank(cls, value: list[str]) -> list[str]:
        if any(not command.strip() for command in value):
            raise ValueError("a setup command must not be blank")
        return value


Permission = Literal["read_only", "workspace_write", "full_access"]


class TaskSpec(_Strict):
    """The task document of the contract (`tasks create --spec FILE` takes the same JSON)."""

    objective: str = Field(min_length=1, description="What the worker should do.")
    worker: str = Field("mock", min_length=1)
    workspace: Workspace
    verification: Verification = Field(default_factory=Verification)
    permission: Permission = "workspace_write"
    limits: Limits = Field(default_factory=Limits)
    network: Network = Field(default_factory=Network)
    environment: Environment | None = Field(
        None, description="The project's environment; absent: config's default for the repository."
    )
    priority: int = Field(50, ge=0, le=100)
    idempotency_key: str | None = None
    metadata: JsonObject = Field(default_factory=dict)

    @field_validator("objective")
    @classmethod
    def _objective_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("objective must not be blank")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_type(cls, value: JsonObject) -> JsonObject:
        # Which types exist is the configuration's (bridge/config/profiles.py checks it at
        # creation); here only the shapes the runner relies on.
        kind = value.get("type")
        if kind is not None and (not isinstance(kind, str) or not kind):
            raise ValueError("metadata.type must be the name of a task type")
        repairs = value.get("auto_repair")
        if repairs is not None and (
            isinstance(repairs, bool) or not isinstance(repairs, int) or repairs < 0
        ):
            raise ValueError("metadata.auto_repair must be a whole number, 0 or more")
        return value


def parse_spec(data: Any) -> TaskSpec:
    """Validate a spec document, turning pydantic's report into one sentence naming the field."""
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidSpec(describe_validation_error(exc, "task spec")) from exc


def describe_validation_error(exc: ValidationError, what: str) -> str:
    errors = exc.errors()
    # An unknown key is usually a misspelling of a required one: name it first.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    where = ".".join(str(part) for part in err["loc"]) or what
    if err["type"] == "extra_forbidden":
        return f"Unknown key '{where}' in the {what}; remove it or check its spelling."
    if err["type"] == "missing":
        return f"The {what} is missing the required key '{where}'."
    msg = err["msg"].removeprefix("Value error, ")
    return f"Invalid value for '{where}' in the {what}: {msg}."


class Status(StrEnum):
    CREATED = "created"
    QUEUED = "queued"
    RUNNING = "running"
    VERIFYING = "verifying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    WAITING_INPUT = "waiting_input"


TERMINAL = frozenset(
    {
        Status.SUCCEEDED,
        Status.FAILED,
        Status.CANCELLED,
        Status.TIMED_OUT,
        Status.ACCEPTED,
        Status.REJECTED,
    }
)

_ENDINGS = {Status.FAILED, Status.CANCELLED, Status.TIMED_OUT}

# Where waiting for a task stops: it ended, or it waits for an answer to a request (no process
# runs it until then; see bridge/pipeline/answer.py).
SETTLED = TERMINAL | {Status.WAITING_INPUT}

# The only status changes the store will write; each is a compare-and-set against the keys.
# A terminal status is never left, except succeeded -> accepted|rejected and a follow-up turn
# (succeeded|failed -> queued) that is asked for explicitly.
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.CREATED: frozenset({Status.QUEUED, Status.CANCELLED, Status.FAILED}),
    Status.QUEUED: frozenset({Status.RUNNING, Status.CANCELLED} | _ENDINGS),
    Status.RUNNING: frozenset(
        {Status.VERIFYING, Status.SUCCEEDED, Status.WAITING_INPUT} | _ENDINGS
    ),
    Status.VERIFYING: frozenset(
        {Status.SUCCEEDED, Status.RUNNING, Status.WAITING_INPUT} | _ENDINGS
    ),
    # A turn ended with a pending request: an answer queues the next turn, a denial (or the
    # input timeout) ends the task with the outcome the turn had, a cancel ends it.
    Status.WAITING_INPUT: frozenset({Status.QUEUED, Status.SUCCEEDED} | _ENDINGS),
    Status.SUCCEEDED: frozenset({Status.ACCEPTED, Status.REJECTED, Status.QUEUED}),
    Status.FAILED: frozenset({Status.QUEUED}),
    Status.CANCELLED: frozenset(),
    Status.TIMED_OUT: frozenset(),
    Status.ACCEPTED: frozenset(),
    Status.REJECTED: frozenset(),
}

# Leaving a terminal status needs the caller to say so (accept, reject, follow-up); so does
# leaving `waiting_input` other than by a cancel (an answer, a denial, the input timeout), so
# no runner's finish can overwrite a task that waits.
EXPLICIT_ONLY = {
    (Status.SUCCEEDED, Status.QUEUED),
    (Status.FAILED, Status.QUEUED),
    (Status.WAITING_INPUT, Status.QUEUED),
    (Status.WAITING_INPUT, Status.SUCCEEDED),
    (Status.WAITING_INPUT, Status.FAILED),
    (Status.WAITING_INPUT, Status.TIMED_OUT),
}


class JobKind(StrEnum):
    COMPETE = "compete"
    REVIEW = "review"
    FANOUT = "fanout"
    INTEGRATE = "integrate"


class JobStatus(StrEnum):
    """A job's statuses: `running` while its coordinator advances it; `succeeded` when it
    reached its end (a compete ranked with a winner), `unresolved` when the caller must choose
    (the judge failed or disagreed with itself), `failed` (no eligible candidate, or an error),
    `cancelled`, and `accepted` once a candidate was accepted through it."""

    CREATED = "created"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    UNRESOLVED = "unresolved"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ACCEPTED = "accepted"


JOB_TERMINAL = frozenset(
    {
        JobStatus.SUCCEEDED,
        JobStatus.UNRESOLVED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.ACCEPTED,
    }
)

ERROR_KINDS = (
    "invalid_spec",
    "worker_exit",
    "verification_failed",
    "protected_path",
    "symlink_escape",
    "binary_change",
    "timeout",
    "out_of_memory",
    "cancelled",
    "sandbox",
    "environment",
    "network",
    "disk",
    "internal",
)


def allowed_sources(target: Status, *, explicit: bool = False) -> frozenset[Status]:
    """Statuses from which ``target`` may be reached."""
    return frozenset(
        src
        for src, dests in TRANSITIONS.items()
        if target in dests and (explicit or (src, target) not in EXPLICIT_ONLY)
    )
