"""The payloads of the events the store keeps (a task's log, a job's), typed where they are built:
a TypedDict per kind for the ones built in steps or in more than one place. They stay plain
dicts, stored as JSON and read back as `Event.data` (bridge/records.py), whose shape is the
contract of `tasks logs` and `worker_logs`. The store takes any payload as a read-only mapping
(`EventData`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NotRequired

from typing_extensions import TypedDict

from bridge.config.profiles import AppliedProfile
from bridge.documents import Skipped

# What the store accepts as an event's payload: a mapping it only reads, to store it as JSON
# (a TypedDict below, or a dict built on the spot).
EventData = Mapping[str, object]


class TaskCreated(TypedDict):
    """`task.created`: where the task runs, its base commit, the profile its type applied and
    the job it belongs to."""

    worker: str
    repository: str
    base_commit: str
    profile: NotRequired[AppliedProfile]
    job_id: NotRequired[str]


class ProbeReleased(TypedDict):
    """`circuit.probe_released` on a probe that no longer holds its breaker's one try: why,
    and its status then."""

    why: str
    status: str


class JobCreated(TypedDict, total=False):
    """`job.created`: the kind and its arguments: compete (workers, judge, skipped), review
    (worker, reviewer, rounds), fanout (how many objectives), integrate (the source job and
    its tasks), with the repository and the base commit its tasks start from."""

    kind: str
    workers: list[str]
    judge: str | None
    skipped: list[Skipped]
    worker: str
    reviewer: str
    rounds: int
    objectives: int
    source_job: str
    tasks: list[str]
    repository: str
    base_commit: str


class Destination(TypedDict, total=False):
    """Where a request through a task's gateway went: a model route, or a host and port
    through its proxy."""

    route: str
    host: str
    port: int


class NetworkRequest(Destination, total=False):
    """`network.request`: one request through the gateway, its answer and what it carried,
    with the tokens its model route reported (or a note once the task's events are capped)."""

    method: str
    status: int
    bytes_up: int
    bytes_down: int
    duration_s: float
    model: str
    input_tokens: int
    output_tokens: int
    error: str
    note: str


class ProgressEvent(TypedDict):
    """`worker.progress`: one step of the worker's output, the same shape for every worker (a
    message, a tool or command it ran, a file it edited, an error it reported)."""

    kind: str
    text: str
    name: str | None
