"""A task that waits for input: the turn's end that leaves it `waiting_input` (the request of
the worker's final message recorded, the outcome the turn had held), the answer to a request,
and what happens once none is pending: with something approved or answered, the worker's own
session is resumed with the answers (a turn queued like a follow-up, in a detached runner);
with only denials (or requests past the input timeout), the task ends with the held outcome,
as it would have without asking (and its worker's circuit breaker counts that ending like any
other). Any process may answer or sweep: every step is a compare-and-set in the store."""

from __future__ import annotations

import time
from pathlib import Path

from bridge.asking import resume_message
from bridge.documents import Coverage, HeldOutcome, RequestAnswer, RequestRecord
from bridge.errors import BridgeError, InvalidSpec, TaskStateError
from bridge.models import Status
from bridge.phase.context import Context
from bridge.phase.handle import PhaseHandle
from bridge.pipeline.follow_up import queue_turn
from bridge.pipeline.outcomes import Outcome
from bridge.pipeline.results import redactor_for
from bridge.store.db import now_iso
from bridge.workers.circuit import record_task_outcome
from bridge.workspace.baseline import tree_entries
from bridge.workspace.diff import list_changes, path_matches
from bridge.workspace.fs import display

DECISIONS = ("approve", "deny")
MAX_ANSWER = 4000  # characters of an answer's text
ANSWERABLE = (Status.QUEUED, Status.RUNNING, Status.VERIFYING, Status.WAITING_INPUT)
COVERS_PATHS = 10  # paths a paths request names per glob
NEW_PATHS = ("added", "renamed")  # changes that leave a path the base does not have


def record_final_request(handle: PhaseHandle, turn: int) -> str | None:
    """The request of the worker's final message in ``turn`` (read from the whole message, not
    the summary cut for display), recorded as pending; None when it holds none in the exact
    shape."""
    record = handle.ctx.store.load_task(handle.task_id)
    exit_info = record.worker_exit
    if exit_info is None or exit_info.turn != turn or exit_info.timed_out or exit_info.oom_killed:
        return None
    found = exit_info.request  # parsed from the whole final message (the summary is cut)
    if found is None:
        return None
    detail = handle.redactor.redact_data(found["detail"])
    if found["kind"] == "paths":
        protected = handle.spec.verification.protected_paths
        if not protected:
            return None  # nothing is protected: there is nothing to allow
        found_in = (record.repository, record.base_commit, record.snapshot_commit)
        coverage = covers(*found_in, protected, detail.get("paths", []))
        detail["covers"] = handle.redactor.redact_data(coverage)  # the worker's file names
    return handle.ctx.store.requests.add(
        handle.task_id,
        found["kind"],
        detail,
        turn=turn,
        expires_at=time.time() + handle.limits.input_timeout_seconds,
    )


def covers(
    repository: str, base: str | None, snapshot: str | None, protected: list[str], globs: list[str]
) -> dict[str, Coverage]:
    """What each glob of a path request would excuse, as the caller sees it before approving:
    the protected files of the base commit it matches (`tests/**` may be 3 files or 3,000) and
    those the worker's snapshot added (a `conf*` that matches nothing of the base still excuses
    the conftest.py the worker wrote), with the first few of their paths, the added first.
    Empty when the commits cannot be read (the request is shown without it)."""
    repo = Path(repository)
    try:
        tree = tree_entries(repo, base or "HEAD", False)
        changes = list_changes(repo, base, snapshot, sizes=False) if base and snapshot else []
    except BridgeError:
        return {}
    in_base = [p for p in tree if path_matches(p, protected)]
    added = [c.path for c in changes if c.change in NEW_PATHS and path_matches(c.path, protected)]
    coverage = {}
    for glob in globs:
        theirs = [p for p in added if path_matches(p, [glob])]
        ours = [p for p in in_base if path_matches(p, [glob])]
        shown = [display(p) for p in (theirs + ours)[:COVERS_PATHS]]
        coverage[glob] = Coverage(base=len(ours), added=len(theirs), paths=shown)
    return coverage


def asked(handle: PhaseHandle, turn: int) -> bool:
    """Whether the task has a pending request at the end of ``turn`` (its worker's final
    message's, recorded here, or a network name its gateway refused)."""
    record_final_request(handle, turn)
    return handle.ctx.store.requests.pending_count(handle.task_id) > 0


def held(handle: PhaseHandle, outcome: Outcome) -> HeldOutcome:
    """The outcome a turn would have ended with, as stored while the task waits (redacted,
    with the timings so far), to end it with on a denial or the input timeout."""
    fields: dict[str, object] = {}
    if "verification" in outcome.fields:
        fields["verification"] = outcome.fields["verification"].model_dump(mode="json")
    err = handle.redactor.redact_data(outcome.error.model_dump()) if outcome.error else None
    return HeldOutcome(status=str(outcome.status), error=err, fields=fields)


def wait_for_input(ctx: Context, handle: PhaseHandle, outcome: Outcome) -> bool:
    """End the runner's part: the task waits for its pending requests with ``outcome`` held.
    False when the task was no longer running (cancelled meanwhile)."""
    store = ctx.store
    doc = held(handle, outcome)
    if not store.transition(
        handle.task_id,
        Status.WAITING_INPUT,
        expect={Status.RUNNING, Status.VERIFYING},
        event={"pending": store.requests.pending_count(handle.task_id)},
        held_outcome=doc,
        verification=doc["fields"].get("verification"),
        timings=handle.timings,
        phase=None,
    ):
        return False
    store.requests.restart_clocks(handle.task_id, time.time() + handle.limits.input_timeout_seconds)
    settle(ctx, handle.task_id)  # answered while the turn ended: go on at once
    return True


def settle(ctx: Context, task_id: str) -> str | None:
    """A waiting task none of whose requests is pending moves on: resumed (`queued`) when an
    answer gives the worker something, else finished with its held outcome. Returns the new
    status (None: it still waits, or someone else moved it)."""
    store = ctx.store
    task = store.load_task(task_id)
    if task.status != Status.WAITING_INPUT or store.requests.pending_count(task_id):
        return None
    answered = store.requests.undelivered(task_id)
    if any(r.status in ("approved", "answered") for r in answered):
        return _resume(ctx, task_id, answered)
    return _finish_held(ctx, task_id)


def _resume(ctx: Context, task_id: str, answered: list[RequestRecord]) -> str | None:
    """The worker's own session resumed with the answers (a turn queued like a follow-up)."""
    queued = queue_turn(
        ctx,
        ctx.store.load_task(task_id),
        resume_message(answered),
        expect={Status.WAITING_INPUT},
        answered=[r.request_id for r in answered],
    )
    return None if queued is None else str(Status.QUEUED)


def _finish_held(ctx: Context, task_id: str) -> str | None:
    task = ctx.store.load_task(task_id)
    doc = task.held_outcome or HeldOutcome(status="failed", error=None, fields={})
    status = Status(doc["status"])
    err = doc.get("error")
    if not ctx.store.transition(
        task_id,
        status,
        explicit=True,
        expect={Status.WAITING_INPUT},
        event={"error": err} if err else {},
        **doc.get("fields", {}),
        error=err,
        held_outcome=None,
        finished_at=now_iso(),
        phase=None,
    ):
        return None
    record_task_outcome(ctx.store, ctx.config, task_id)  # its worker's breaker counts it too
    return str(status)


def answer_request(
    ctx: Context,
    task_id: str,
    request_id: str,
    *,
    decision: str | None = None,
    text: str | None = None,
) -> None:
    """Answer one pending request of ``task_id`` (InvalidSpec or TaskStateError, one sentence,
    and nothing changed, for an answer that does not fit), then let the task move on if
    nothing is pending any more."""
    store = ctx.store
    expire_due(ctx)  # a request past its deadline is expired, not answerable
    task = store.load_task(task_id)
    request = next(
        (r for r in store.requests.for_task(task_id) if r.request_id == request_id), None
    )
    if request is None:
        raise InvalidSpec(f"Task {task_id} has no request '{request_id}'; see its `requests`.")
    status, answer = _check_answer(request, decision, text)
    if request.status != "pending":
        raise TaskStateError(
            f"Request {request_id} of task {task_id} is already {request.status}; only a "
            "pending request takes an answer."
        )
    if task.status not in ANSWERABLE:
        raise TaskStateError(
            f"Task {task_id} is {task.status}; its requests can no longer be answered."
        )
    shown = redactor_for(task).redact_data(answer)
    live = tuple(str(s) for s in ANSWERABLE)
    if not store.requests.resolve(task_id, request_id, status, answer, shown, live):
        raise TaskStateError(  # the task's status is checked in the same write: a cancel
            f"Request {request_id} of task {task_id} was answered, or its task moved on, "
            "meanwhile; check it again."  # in between leaves the request as the cancel made it
        )
    settle(ctx, task_id)


def _check_answer(
    request: RequestRecord, decision: str | None, text: str | None
) -> tuple[str, RequestAnswer]:
    """The request's new status and the answer to record, or InvalidSpec saying why not."""
    if (decision is None) == (text is None):
        raise InvalidSpec("Answer with exactly one of a decision (approve or deny) or a text.")
    if decision is not None:
        if decision not in DECISIONS:
            raise InvalidSpec(f"Unknown decision '{decision}'; use approve or deny.")
        if request.kind == "question" and decision == "approve":
            raise InvalidSpec(
                f"Request {request.request_id} is a question: answer it with a text (or deny "
                "it to let the task finish without an answer)."
            )
        return ("approved" if decision == "approve" else "denied"), RequestAnswer(decision=decision)
    assert text is not None
    if request.kind != "question":
        raise InvalidSpec(
            f"Request {request.request_id} asks for {request.kind}: answer it with approve or "
            "deny, not a text."
        )
    if not text.strip() or len(text) > MAX_ANSWER:
        raise InvalidSpec(f"The answer's text must be 1 to {MAX_ANSWER} characters.")
    return "answered", RequestAnswer(text=text)


def expire_due(ctx: Context, now: float | None = None) -> list[str]:
    """Requests past the input timeout count as denied; waiting tasks left with nothing
    pending move on (also one whose runner died between waiting and moving it on). Returns
    the tasks whose requests expired."""
    tasks = ctx.store.requests.expire_due(now)
    for task_id in sorted(set(tasks) | set(ctx.store.requests.unsettled())):
        settle(ctx, task_id)
    return tasks
