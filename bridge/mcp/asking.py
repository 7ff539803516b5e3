"""A worker's question put to the user in place, in a blocking call (`wait: true`) whose client
can take an elicitation (it declared the capability on the handshake): instead of returning a
task in `waiting_input` for the model to answer with `worker_answer`, each pending request is
asked there and then, and its answer goes to the worker exactly as `worker_answer` sends it.

- a question: its text, its choices as an enum (free text when it has none); declined or
  cancelled, the question is declined;
- a network or paths request: accept or decline, with what exactly is asked (the host and
  port; the paths and how many protected files each covers).

What a request says is the worker's, untrusted: the message says so. A client that cannot take
an elicitation (or a 2026-07-28 session, where a server cannot send one in the middle of a
call) gets the task in `waiting_input` as before.
"""

from __future__ import annotations

from typing import Any, Literal

from mcp.server.mcpserver import Context
from mcp.types import ClientCapabilities, ElicitationCapability
from pydantic import BaseModel, Field, create_model

from bridge.display import describe_request
from bridge.mcp.calls import BridgeCalls
from bridge.mcp.results import plain
from bridge.records import TaskResult

UNTRUSTED = "The worker wrote this request; it is not an instruction from worker-bridge."


class _Decision(BaseModel):
    """Accept approves what is asked (for this task only); decline denies it."""


def can_elicit(ctx: Context | None) -> bool:
    """Whether this call's client takes an elicitation in the middle of a call."""
    if ctx is None:
        return False
    try:
        session = ctx.request_context.session
    except ValueError:
        return False
    wanted = ClientCapabilities(elicitation=ElicitationCapability())
    modern = ctx.request_context.protocol_version >= "2026"
    return not modern and session.check_client_capability(wanted)


async def ask_in_place(call: BridgeCalls, ctx: Context, result: TaskResult) -> bool:
    """Each pending request of the task put to the user and answered; whether any was."""
    answered = False
    for request in [r for r in result.requests if r["status"] == "pending"]:
        kwargs = await _asked(ctx, result.task_id, request)
        await call(call.bridge.answer, result.task_id, request["request_id"], **kwargs)
        answered = True
    return answered


async def _asked(ctx: Context, task_id: str, request: Any) -> dict[str, Any]:
    """The user's answer to one request, as worker_answer's arguments."""
    detail: Any = request.get("detail") or {}
    asked: Any = {"kind": request["kind"], "detail": detail}
    what = plain(describe_request(asked))  # the worker's words: on one line, before ours
    form: type[BaseModel] = _Decision
    if request["kind"] == "question":
        choices = tuple(str(c) for c in detail.get("choices") or [])
        kind: Any = Literal[choices] if choices else str
        answer: Any = (kind, Field(description="Your answer to the worker's question."))
        form = create_model("Answer", answer=answer)
        message = f"Task {task_id}'s worker asks: {what}\n\n{UNTRUSTED}"
    else:
        message = (
            f"Task {task_id}'s worker asks to {what}. Accept approves it for this task only; "
            f"decline denies it.\n\n{UNTRUSTED}"
        )
    found: Any = await ctx.elicit(message, form)
    if found.action != "accept":
        return {"decision": "deny"}
    if request["kind"] == "question":
        return {"text": str(found.data.answer)}
    return {"decision": "approve"}
