"""The parts of asking that need no engine: the block of a final message read only in its
exact shape (the worker writes it, so it is hostile), the `waiting_input` transitions, and the
requests table shared by processes (a network attempt, an answer, expiry), on a real SQLite
store."""

from __future__ import annotations

import json

import pytest
from support.tasks import new_task

from bridge.asking import MAX_BLOCK, parse_request_block, resume_message
from bridge.errors import InvalidTransition
from bridge.models import Status, allowed_sources

FENCE = "```"


def running_task(store) -> None:
    """Task t1 in the store, running (a runner's side, without a runner)."""
    store.insert_task(new_task("t1", objective="x"), {})
    with store.transaction() as conn:
        store.set_status(conn, "t1", "created", "queued")
        store.set_status(conn, "t1", "queued", "running")


def block(doc: object, info: str = "worker-bridge-request") -> str:
    return f"{FENCE}{info}\n{json.dumps(doc)}\n{FENCE}"


def test_a_question_or_a_path_request_in_its_exact_shape_is_read():
    question = {"kind": "question", "text": "Which DB?", "choices": ["sqlite", "redis"]}
    message = "Done so far.\n\n```python\nprint('hi')\n```\n" + block(question)
    assert parse_request_block(message) == {
        "kind": "question",
        "detail": {"text": "Which DB?", "choices": ["sqlite", "redis"]},
    }
    paths = {"kind": "paths", "paths": ["tests/**", "tests/**", "a.py"], "reason": "stale"}
    assert parse_request_block(block(paths)) == {
        "kind": "paths",
        "detail": {"paths": ["tests/**", "a.py"], "reason": "stale"},
    }


@pytest.mark.parametrize(
    "message",
    [
        None,
        "no block at all",
        block({"kind": "question", "text": "a"}) + "\n" + block({"kind": "question", "text": "b"}),
        block({"kind": "question", "text": "a", "approved": True}),
        block({"kind": "question", "text": 3}),
        block({"kind": "question", "text": "a", "choices": "sqlite"}),
        block({"kind": "question", "text": "a", "choices": []}),
        block({"kind": "question", "text": "a", "choices": ["x"] * 11}),
        block({"kind": "question", "text": "a", "choices": ["\x1b[2J"]}),
        block({"kind": "question", "text": "x" * 1001}),
        block({"kind": "question", "text": "x" * (MAX_BLOCK + 10)}),
        block({"kind": "paths", "paths": ["../outside"], "reason": "r"}),
        block({"kind": "paths", "paths": ["/etc/passwd"], "reason": "r"}),
        block({"kind": "paths", "paths": ["a//b"], "reason": "r"}),
        block({"kind": "paths", "paths": ["a\\..\\b"], "reason": "r"}),
        block({"kind": "paths", "paths": ["a"] * 21, "reason": "r"}),
        block({"kind": "paths", "paths": ["a"]}),
        block({"kind": "network", "host": "evil.example"}),  # only the gateway raises those
        block(["kind", "question"]),
        block({"kind": "question", "text": "a"}, info="worker-bridge-request-x"),
        f"{FENCE}worker-bridge-request\n{{not json}}\n{FENCE}",
        f"{FENCE}worker-bridge-request\n" + json.dumps({"kind": "question", "text": "unclosed"}),
    ],
)
def test_anything_else_is_ignored(message):
    assert parse_request_block(message) is None


def test_control_characters_in_a_question_or_a_reason_are_neutralised():
    text = "Proceed?\x1b]0;pwned\x07\x1b[2J\r\nline two\u202eevil\x9b31m\tok"
    found = parse_request_block(block({"kind": "question", "text": text}))
    assert found is not None
    shown = found["detail"]["text"]
    assert not any(c in shown for c in "\x1b\x07\r\u202e\x9b")
    assert shown.startswith("Proceed?\ufffd]0;pwned") and "\nline two" in shown and "\tok" in shown
    paths = parse_request_block(block({"kind": "paths", "paths": ["a"], "reason": "x\x1b[2Jy"}))
    assert paths is not None and paths["detail"]["reason"] == "x\ufffd[2Jy"


def test_waiting_input_is_left_only_by_a_cancel_or_explicitly():
    assert Status.WAITING_INPUT in allowed_sources(Status.CANCELLED)
    for target in (Status.QUEUED, Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT):
        assert Status.WAITING_INPUT not in allowed_sources(target)
        assert Status.WAITING_INPUT in allowed_sources(target, explicit=True)
    assert allowed_sources(Status.WAITING_INPUT) == {Status.RUNNING, Status.VERIFYING}


def test_the_store_moves_a_waiting_task_only_as_declared(tmp_path):
    from bridge.store import Store

    store = Store(tmp_path / "bridge.db")
    running_task(store)
    assert store.transition("t1", Status.WAITING_INPUT, expect={Status.RUNNING})
    assert not store.transition("t1", Status.SUCCEEDED)  # a runner's finish cannot land
    assert store.status("t1") == "waiting_input"
    with pytest.raises(InvalidTransition):
        with store.transaction() as conn:
            store.set_status(conn, "t1", "waiting_input", "verifying")
    assert store.transition("t1", Status.QUEUED, explicit=True, expect={Status.WAITING_INPUT})


def test_network_attempts_answers_and_expiry_are_one_truth_in_the_store(tmp_path):
    from bridge.store import Store

    path = tmp_path / "bridge.db"
    gateway, caller = Store(path), Store(path)  # two connections, as two processes have
    running_task(gateway)
    args = {"turn": 0, "expires_at": 2_000_000_000.0, "max_requests": 2}
    status, rid = gateway.requests.network_attempt("t1", "pypi.org", 443, **args)
    assert status == "pending" and rid
    assert gateway.requests.network_attempt("t1", "pypi.org", 443, **args) == ("pending", rid)
    assert caller.requests.resolve("t1", rid, "approved", {"decision": "approve"}, {})
    assert not caller.requests.resolve("t1", rid, "denied", {"decision": "deny"}, {})
    assert gateway.requests.network_attempt("t1", "pypi.org", 443, **args) == ("approved", rid)
    [request] = caller.requests.for_task("t1")
    assert request.attempts == 3 and request.status == "approved"
    # The bound: a second name is one more request, a third is refused without one.
    assert gateway.requests.network_attempt("t1", "b.org", 443, **args)[0] == "pending"
    assert gateway.requests.network_attempt("t1", "c.org", 443, **args) == ("over", None)
    assert caller.requests.expire_due(now=2_000_000_001.0) == ["t1"]
    statuses = {r.detail["host"]: r.status for r in caller.requests.for_task("t1")}
    assert statuses == {"pypi.org": "approved", "b.org": "expired"}
    kinds = [e.kind for e in caller.events("t1") if e.kind.startswith("task.")]
    assert kinds[-4:] == ["task.request", "task.answer", "task.request", "task.answer"]


def test_the_resume_message_says_what_each_answer_was():
    from bridge.documents import RequestRecord

    def req(kind, detail, status, answer=None):
        return RequestRecord(
            request_id="r1",
            task_id="t",
            kind=kind,
            detail=detail,
            status=status,
            at="now",
            answer=answer,
        )

    text = resume_message(
        [
            req("network", {"host": "pypi.org", "port": 443}, "approved"),
            req("paths", {"paths": ["tests/**"]}, "denied"),
            req("question", {"text": "Which?"}, "answered", {"text": "sqlite"}),
        ]
    )
    assert "network access to pypi.org:443: approved" in text
    assert "changing protected paths tests/**: denied" in text
    assert 'your question "Which?": answered: sqlite' in text


def test_the_live_view_shows_a_request_with_the_command_that_answers_it():
    from bridge.cli.live import describe
    from bridge.records import Event

    raised = Event(
        event_id=1,
        task_id="t1",
        kind="task.request",
        at="now",
        data={"request_id": "r1", "kind": "network", "detail": {"host": "pypi.org", "port": 443}},
    )
    line = describe(raised)
    assert line is not None and "reach pypi.org:443" in line
    assert "worker-bridge tasks answer t1 r1 (--approve | --deny | --text TEXT)" in line
    waiting = Event(
        event_id=2, task_id="t1", kind="task.status", at="now", data={"to": "waiting_input"}
    )
    assert "waiting for input" in (describe(waiting) or "")


def test_a_waiting_task_left_with_nothing_pending_is_moved_on_by_the_sweep(tmp_path):
    from bridge.config.settings import load_config
    from bridge.phase.context import Context
    from bridge.pipeline.answer import expire_due
    from bridge.sandbox.fake import FakeSandbox
    from bridge.store import Store

    config = load_config({"WORKER_BRIDGE_HOME": str(tmp_path)})
    store = Store(tmp_path / "bridge.db")
    running_task(store)
    held = {"status": "failed", "error": {"kind": "worker_exit", "message": "It failed."}}
    assert store.transition("t1", Status.WAITING_INPUT, held_outcome={**held, "fields": {}})
    rid = store.requests.add("t1", "question", {"text": "?"}, turn=0, expires_at=2e9)
    assert rid and store.requests.resolve("t1", rid, "denied", {"decision": "deny"}, {})
    # The runner died before moving it on: the next sweep ends it with its held outcome.
    ctx = Context(config=config, store=store, sandbox=FakeSandbox())
    expire_due(ctx)
    record = store.load_task("t1")
    assert record.status == "failed" and record.error is not None
    assert record.error.message == "It failed." and record.held_outcome is None


def test_an_answer_that_meets_a_cancel_in_between_changes_nothing(tmp_path):
    # The answer's own check of the task's status ran before a cancel (another process) moved
    # it on: the write itself must see the cancel, or a cancelled task shows an approval.
    from bridge.pipeline.answer import ANSWERABLE
    from bridge.store import Store

    store = Store(tmp_path / "bridge.db")
    running_task(store)
    args = {"turn": 0, "expires_at": 2_000_000_000.0, "max_requests": 2}
    _, rid = store.requests.network_attempt("t1", "pypi.org", 443, **args)
    live = tuple(str(s) for s in ANSWERABLE)
    with store.transaction() as conn:
        store.set_status(conn, "t1", "running", "cancelled")
    assert not store.requests.resolve("t1", rid, "approved", {"decision": "approve"}, {}, live)
    [request] = store.requests.for_task("t1")
    assert request.status != "approved"
    assert store.events("t1", kinds=("task.answer",)) == []
