"""The web view's actions: accept, reject, cancel, follow-up and answer on a task; accept and
cancel on a job. Each is one facade call made as the CLI makes it (after the same recovery of
tasks whose runner died), refused unless the request carries the whole session (the cookie and
its key in `X-UI-Key`) and this page's Origin (checked by the gate). A refusal by the bridge
comes back as the CLI's one sentence. Signing out is an action too (it needs the same)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bridge.errors import BridgeError, InvalidSpec
from bridge.models import JsonObject
from bridge.records import AcceptResult, JobResult, TaskResult
from bridge.ui import views
from bridge.ui.routes import (
    PREFIX,
    UiState,
    error_response,
    read_body,
    unauthorized,
    unreadable,
)

MAX_BODY = 64 * 1024
# A verb: the facade call an action makes with the request's JSON body (from the page: any
# object, each verb reads the keys it takes), and the result the page is sent.
Verb = Callable[[UiState, str, JsonObject], TaskResult | JobResult | AcceptResult]


def action_routes(state: UiState) -> list[Route]:
    task, job = f"{PREFIX}/api/tasks/{{id}}", f"{PREFIX}/api/jobs/{{id}}"

    async def logout(request: Request) -> Response:
        session_id = state.session_of(request)
        if session_id is None:
            return unauthorized()
        state.sessions.close(session_id)
        response = JSONResponse({"ok": True}, headers={"cache-control": "no-store"})
        response.headers["set-cookie"] = state.sessions.expired_cookie_header()
        return response

    return [
        Route(f"{PREFIX}/logout", logout, methods=["POST"]),
        Route(f"{task}/accept", _action(state, accept_task), methods=["POST"]),
        Route(f"{task}/reject", _action(state, reject_task), methods=["POST"]),
        Route(f"{task}/cancel", _action(state, cancel_task), methods=["POST"]),
        Route(f"{task}/follow-up", _action(state, follow_up), methods=["POST"]),
        Route(f"{task}/answer", _action(state, answer), methods=["POST"]),
        Route(f"{job}/accept", _action(state, accept_job), methods=["POST"]),
        Route(f"{job}/cancel", _action(state, cancel_job), methods=["POST"]),
    ]


def _action(state: UiState, verb: Verb) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        if state.session_of(request) is None:
            return unauthorized()
        try:
            body = await _json_body(request)
            await state.call(state.bridge.recover)  # as the CLI does before a command that acts
            outcome = await state.call(verb, state, request.path_params["id"], body)
        except BridgeError as exc:
            return error_response(exc)
        except (RecursionError, OverflowError):
            return unreadable()
        return JSONResponse(views.page(outcome), headers={"cache-control": "no-store"})

    return run


async def _json_body(request: Request) -> JsonObject:
    raw = await read_body(request, MAX_BODY)
    if raw is None:
        raise InvalidSpec(f"The request is larger than {MAX_BODY // 1024} KB.")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: '[' nested past the parser's depth
        raise InvalidSpec("The request is not JSON.") from None
    if not isinstance(body, dict):
        raise InvalidSpec("The request must be a JSON object.")
    return body


def _text(body: JsonObject, key: str) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise InvalidSpec(f"'{key}' must be text.")
    return value


def _refused_unless(result: TaskResult, wanted: str, task_id: str, refused: str) -> TaskResult:
    """A verb that ends a task: refused with the CLI's sentence when it did not get there."""
    if str(result.status) != wanted:
        raise InvalidSpec(f"Task {task_id} {refused.format(status=result.status)}")
    return result


def accept_task(state: UiState, task_id: str, body: JsonObject) -> AcceptResult:
    outcome = state.bridge.accept_task(
        task_id, allow_unverified=body.get("allow_unverified") is True
    )
    if not outcome.accepted:
        raise InvalidSpec(outcome.reason or "")
    return outcome


def reject_task(state: UiState, task_id: str, body: JsonObject) -> TaskResult:
    result = state.bridge.reject_task(task_id, _text(body, "reason"))
    return _refused_unless(
        result, "rejected", task_id, "is {status}; only a succeeded task can be rejected."
    )


def cancel_task(state: UiState, task_id: str, body: JsonObject) -> TaskResult:
    result = state.bridge.cancel_task(task_id)
    refused = "already ended {status}; nothing to cancel."
    return _refused_unless(result, "cancelled", task_id, refused)


def follow_up(state: UiState, task_id: str, body: JsonObject) -> TaskResult:
    return state.bridge.follow_up(task_id, _text(body, "message"))


def answer(state: UiState, task_id: str, body: JsonObject) -> TaskResult:
    """`answer(task_id, request_id, decision=..., text=...)`, as `tasks answer` calls it."""
    state.bridge.task_status(task_id)  # absent (unknown, outside the scope) before all else
    decision = body.get("decision")
    if decision not in (None, "approve", "deny"):
        raise InvalidSpec("'decision' must be approve or deny.")
    text = body.get("text")
    if text is not None and not isinstance(text, str):
        raise InvalidSpec("'text' must be text.")
    if (decision is None) == (text is None):
        raise InvalidSpec("Give a decision (approve or deny) or a text answer, one of them.")
    return state.bridge.answer(task_id, _text(body, "request_id"), decision=decision, text=text)


def accept_job(state: UiState, job_id: str, body: JsonObject) -> AcceptResult:
    """The job's best candidate, or ``task_id``'s when given: given, it must name one (an empty
    or odd value is refused, never read as "the best")."""
    chosen = body.get("task_id")
    if chosen is not None and (not isinstance(chosen, str) or not chosen.strip()):
        raise InvalidSpec("'task_id' must name one of the job's tasks.")
    outcome = state.bridge.accept_job(job_id, chosen)
    if not outcome.accepted:
        raise InvalidSpec(outcome.reason or "")
    return outcome


def cancel_job(state: UiState, job_id: str, body: JsonObject) -> JobResult:
    """As `jobs cancel`: a job that had already ended is refused with the CLI's sentence."""
    result = state.bridge.cancel_job(job_id)
    if result.status != "cancelled":
        raise InvalidSpec(f"Job {job_id} already ended {result.status}.")
    return result
