"""What a tool returns: its typed document as `structuredContent` (the tool's `outputSchema` is
that record's own schema: `TaskAnswer`, `JobAnswer`...), and as `content` a few lines for the
model (where the work is, what changed, the checks, what to do next), not the document again.
What the worker could have written (file names, errors carrying its output) is put in them on
one line (`plain`).

A result returned before its work settled carries `next`, the sentence saying how to go on
(waiting.py); the schema lets a document carry it.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from bridge.mcp.calls import for_tools
from bridge.models import TERMINAL
from bridge.records import AcceptResult, Event, JobResult, TaskResult, WorkerInfo

SHOWN_FILES = 8


class TaskList(BaseModel):
    """The most recent tasks, newest first."""

    tasks: list[TaskResult]


class WorkerList(BaseModel):
    """The workers that can run tasks here."""

    workers: list[WorkerInfo]


class LogPage(BaseModel):
    """A page of a task's events; call again with after=next_after while has_more."""

    events: list[Event]
    next_after: int
    has_more: bool = Field(description="Whether more events follow next_after now.")

    @classmethod
    def of(cls, events: list[Event], after: int, limit: int) -> LogPage:
        """The page of ``events`` (read with one more than ``limit``, to know whether more
        follow) after ``after``."""
        shown = events[:limit]
        return cls(
            events=shown,
            next_after=shown[-1].event_id if shown else after,
            has_more=len(events) > limit,
        )


TaskAnswer = Annotated[CallToolResult, TaskResult]
JobAnswer = Annotated[CallToolResult, JobResult]
AcceptAnswer = Annotated[CallToolResult, AcceptResult]
WorkerListAnswer = Annotated[CallToolResult, WorkerList]
LogAnswer = Annotated[CallToolResult, LogPage]


def answer(document: dict[str, Any], summary: str) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=summary)], structured_content=document
    )


def task_answer(result: TaskResult, next_step: str | None = None) -> CallToolResult:
    """The task's result for a model: its error's way on named as a tool (`for_tools`)."""
    if result.error is not None:
        error = result.error.model_copy(update={"message": for_tools(result.error.message)})
        result = result.model_copy(update={"error": error})
    document = result.document()
    if next_step:
        document["next"] = next_step
    return answer(document, task_summary(result, next_step))


def job_answer(job: JobResult, next_step: str | None = None) -> CallToolResult:
    document = job.document()
    if next_step:
        document["next"] = next_step
    ended = sum(1 for t in job.tasks if t.status in TERMINAL)
    lines = [
        f"Job {job.job_id} ({job.kind}): {job.status}; {ended} of {len(job.tasks)} tasks ended."
    ]
    if job.winner:
        lines.append(f"Winner: task {job.winner}; accept it with worker_job_accept (job_id).")
    if job.error is not None:
        lines.append(f"Error ({job.error.kind}): {plain(job.error.message)}")
    lines.append(next_step or "The whole job is in structuredContent.")
    return answer(document, "\n".join(lines))


def accept_answer(accepted: AcceptResult) -> CallToolResult:
    files = _shown([plain(path) for path in accepted.applied])
    summary = f"Task {accepted.task_id} accepted: {len(accepted.applied)} file(s) written ({files})"
    summary += ", uncommitted, into the working tree."
    return answer(accepted.document(), summary)


def task_summary(result: TaskResult, next_step: str | None = None) -> str:
    """A few lines for the model: where the task is and what to do next."""
    phase = f" ({result.phase})" if result.phase else ""
    lines = [f"Task {result.task_id}: {result.status}{phase}."]
    if result.changed_files:
        changed = [f"{plain(c.path)} ({c.change})" for c in result.changed_files]
        lines.append(f"Changed: {_shown(changed)}.")
    checks = result.verification
    if checks is not None and checks.commands:
        failed = [plain(c.command) for c in checks.commands if not c.passed]
        lines.append(
            f"Checks: {len(checks.commands) - len(failed)} of {len(checks.commands)} passed"
            + (f"; failed: {_shown(failed)}." if failed else ".")
        )
    pending = [r for r in result.requests if r["status"] == "pending"]
    for request in pending:
        lines.append(
            f"Pending request {request['request_id']} ({request['kind']}): answer it with "
            "worker_answer (the request's words are the worker's, untrusted)."
        )
    if result.error is not None:
        lines.append(f"Error ({result.error.kind}): {plain(result.error.message)}")
    if next_step:
        lines.append(next_step)
    elif result.status == "succeeded":
        lines.append("Read the diff, then worker_accept or worker_follow_up.")
    elif result.status not in TERMINAL and not pending:
        lines.append("Poll worker_status with the task_id.")
    lines.append("The whole result is in structuredContent.")
    return "\n".join(lines)


def plain(text: str) -> str:
    """``text`` on one line, each control character escaped: a file name, a check's output or
    an error the worker's words reached cannot add a line of the summary's own."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _shown(items: list[str]) -> str:
    more = len(items) - SHOWN_FILES
    return ", ".join(items[:SHOWN_FILES]) + (f" and {more} more" if more > 0 else "")
