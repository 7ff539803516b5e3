"""What the pages are sent: a task as a row of the list, a task and a job as their pages show
them, a diff's text, and an event as the CLI's live view would print it. Documents only: the
page's scripts put every string a worker wrote into the page as text, never as markup."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

from bridge.display import describe, describe_request, one_line, terminal_safe
from bridge.documents import RequestDoc
from bridge.records import AcceptResult, Event, JobResult, TaskResult
from bridge.ui.diff_names import DiffFile, diff_files

SHOWN_WIDTH = 2000  # characters of one event line on the page


class ShownRequest(RequestDoc):
    """A request with a few words of what it asks (the words `tasks show` prints)."""

    what: str


class TaskRow(TypedDict):
    """A task as a row of the list (and of a task page's header)."""

    task_id: str
    status: str
    phase: str | None
    worker: str
    repository: str
    objective: str
    created_at: str
    finished_at: str | None
    verification: bool | None
    checks: int
    pending: int
    job_id: str | None
    job_role: str | None


class JobRow(TypedDict):
    """A job as a row of the list."""

    job_id: str
    kind: str
    status: str
    repository: str
    objective: str
    created_at: str
    tasks: int


class DiffText(TypedDict):
    text: str
    truncated: bool
    total_bytes: int
    files: list[DiffFile | None]  # each file's name as git wrote it, read exactly


class EventLine(TypedDict):
    event_id: int
    at: str
    kind: str
    line: str


def requests_of(result: TaskResult) -> list[ShownRequest]:
    """The task's permission requests and questions, each with a few words of what it asks
    (the words `tasks show` prints)."""
    return [{**r, "what": describe_request(r, r.get("attempts", 1))} for r in result.requests]


def task_row(result: TaskResult) -> TaskRow:
    verification = result.verification
    return {
        "task_id": result.task_id,
        "status": str(result.status),
        "phase": result.phase,
        "worker": result.worker,
        "repository": result.repository,
        "objective": one_line(result.objective.strip())[:300],
        "created_at": result.created_at,
        "finished_at": result.finished_at,
        "verification": None if verification is None else verification.ok,
        "checks": 0 if verification is None else len(verification.commands),
        "pending": sum(1 for r in requests_of(result) if r.get("status") == "pending"),
        "job_id": result.job_id,
        "job_role": result.job_role,
    }


def page(outcome: TaskResult | JobResult | AcceptResult) -> dict[str, Any]:
    """What a page is sent after an action: the task's page, the job's, or what accept did."""
    if isinstance(outcome, TaskResult):
        return task_page(outcome)
    return outcome.document()


def task_page(result: TaskResult) -> dict[str, Any]:
    doc = result.document()
    doc["requests"] = requests_of(result)
    doc["row"] = task_row(result)
    doc.pop("artifacts", None)  # host paths: the page fetches the diff through the API
    return doc


def job_row(result: JobResult) -> JobRow:
    return {
        "job_id": result.job_id,
        "kind": result.kind,
        "status": result.status,
        "repository": result.repository,
        "objective": one_line(result.objective.strip())[:300],
        "created_at": result.created_at,
        "tasks": len(result.tasks),
    }


def job_page(result: JobResult) -> dict[str, Any]:
    return result.document()


def diff_document(result: TaskResult, limit: int) -> DiffText:
    """The task's diff (base to snapshot) in its readable form, for the page (a file git shows
    as binary given as its text, what is not text escaped; the diff as git wrote it for a task
    collected before there was one): ``text`` (empty when there is none yet), whether it was
    ``truncated``, the diff's ``total_bytes``, and each shown file's name read exactly
    (``files``: the renderer reads them its own way). A diff over ``limit`` bytes is cut at the
    last whole file within it (the start of a `diff --git` line), or, when the first file alone
    is over it, at the last whole line: what is shown is always whole hunks' lines the renderer
    can read. Accept writes all of it: the page says so."""
    path = result.artifacts.get("readable") or result.artifacts.get("diff")
    data, total = b"", 0
    if path:
        try:
            with Path(path).open("rb") as handle:
                total = os.fstat(handle.fileno()).st_size
                data = handle.read(limit + 1)
        except OSError:
            data, total = b"", 0
    truncated = len(data) > limit
    if truncated:
        data = data[:limit]
        boundary = data.rfind(b"\ndiff --git ")
        data = data[: boundary + 1] if boundary >= 0 else data[: data.rfind(b"\n") + 1]
    return {
        "text": data.decode("utf-8", "replace"),
        "truncated": truncated,
        "total_bytes": max(total, len(data)),
        "files": diff_files(data),
    }


def event_line(event: Event) -> EventLine | None:
    """An event for the task page's live stream: the CLI live view's line (terminal-safe, one
    line), status changes too; None for one it does not show."""
    line = describe(event)
    if line is None and event.kind == "task.status":
        line = f"status: {event.data.get('to')}"
    elif line is None and event.kind in ("task.request", "task.answer", "task.accepted"):
        line = event.kind.replace("task.", "")
    if line is None:
        return None
    return {
        "event_id": event.event_id,
        "at": event.at,
        "kind": event.kind,
        "line": terminal_safe(one_line(line.strip()))[:SHOWN_WIDTH],
    }
