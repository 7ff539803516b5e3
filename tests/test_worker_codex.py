"""The `codex` worker for real: the Codex CLI binary in its built image, run by the engine on
a task, reaching the scripted model server only through the task's gateway (the real key is
added on the host). The model's plan is written in each task's text (see
bridge/smoke/model_server.py)."""

from __future__ import annotations

import json

import pytest
from support.real_workers import (
    KEY,
    KEY_VARS,
    assert_key_nowhere,
    assert_only_model_route,
    ensure_worker_image,
)
from support.repos import git
from support.tasks import run_spec as run_task
from support.tasks import task_events as events

pytestmark = pytest.mark.usefixtures("docker_images")


@pytest.fixture
def codex(home, real_env):
    from bridge.config import load_config

    ensure_worker_image(load_config({"WORKER_BRIDGE_HOME": str(home)}), "codex")
    return real_env


def _spec(repo, objective: str, **extra) -> dict:
    return {
        "objective": objective,
        "worker": "codex",
        "workspace": {"repository": str(repo)},
        **extra,
    }


def _user_texts(request) -> list[str]:
    from bridge.smoke.apis.responses import API

    return API.conversation(request.body or {}).user_texts


def test_codex_writes_with_apply_patch_resumes_its_session_and_keeps_the_key_away(
    cli,
    repo,
    workdir,
    home,
    codex,
    model_server,
):
    objective = (
        "Add a greeting file.\n"
        "@write hello.txt: hello from codex\n"
        "@follow-write hello.txt: hello from codex, again\n"
        "@say Wrote hello.txt."
    )
    spec = _spec(repo, objective, verification={"commands": ["grep -q 'hello from' hello.txt"]})
    result = run_task(cli, workdir, spec, codex)
    task_id = result["task_id"]
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    assert result["summary"] == "Wrote hello.txt."
    assert result["changed_files"] == [{"path": "hello.txt", "change": "added"}]
    assert git(repo, "show", f"{result['branch']}:hello.txt") == "hello from codex\n"
    session = result["session_id"]
    assert session and len(session) == 36  # Codex's thread id, a UUID

    progress = [e["data"] for e in events(cli, task_id, codex, "worker.progress")]
    assert all(set(p) == {"kind", "text", "name"} for p in progress), progress
    assert {"kind": "file_edit", "text": "add hello.txt", "name": "apply_patch"} in progress
    assert {"kind": "message", "text": "Wrote hello.txt.", "name": None} in progress

    # The model was asked with apply_patch on offer, and got its patch's result back.
    first = model_server.api_requests("responses")
    tools = {t.get("name") for t in first[0].body["tools"]}
    assert "apply_patch" in tools
    assert first[-1].body["input"][-1]["type"] == "custom_tool_call_output"
    assert "Success" in first[-1].body["input"][-1]["output"]

    # A follow-up resumes the same session: the model sees the first turn's messages.
    followed = cli(
        "tasks", "follow-up", task_id, "Say it again.", "--wait", "--json", env=codex, timeout=300
    )
    assert followed.code == 0, followed.stderr
    done = json.loads(cli("tasks", "show", task_id, "--json", env=codex).stdout)
    assert done["status"] == "succeeded", done["error"]
    assert done["session_id"] == session
    later = model_server.api_requests("responses")[len(first) :]
    assert _user_texts(later[0]) == [objective + "\n", "Say it again.\n"]
    assert git(repo, "show", f"{done['branch']}:hello.txt") == "hello from codex, again\n"
    started = events(cli, task_id, codex, "worker.started")
    assert [e["data"]["turn"] for e in started] == [0, 1]

    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in first + later)
    assert_key_nowhere(home)
    assert_only_model_route(cli, task_id, codex, model_server)


def test_a_failed_verification_gets_a_repair_turn_in_the_same_session(
    cli,
    repo,
    workdir,
    codex,
    model_server,
):
    objective = "Make the check pass.\n@write f.txt: wrong\n@repair-write f.txt: right\n@say Fixed."
    spec = _spec(repo, objective, verification={"commands": ["grep -q right f.txt"]})
    result = run_task(cli, workdir, spec, codex)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    assert git(repo, "show", f"{result['branch']}:f.txt") == "right\n"
    kinds = [e["kind"] for e in events(cli, result["task_id"], codex)]
    assert kinds.count("worker.started") == 2
    assert kinds.count("verification.auto_repair") == 1
    # The repair turn was sent in the first turn's session, the failure's output with it.
    texts = [_user_texts(r) for r in model_server.api_requests("responses")]
    repair = next(t for t in texts if len(t) > 1)
    assert repair[0] == objective + "\n" and "Verification failed" in repair[1]


def test_a_refused_key_fails_fast_naming_the_variable(
    cli,
    repo,
    workdir,
    codex,
    model_server,
):
    result = run_task(cli, workdir, _spec(repo, "Do it.\n@fail-auth"), codex)
    assert result["status"] == "failed"
    error = result["error"]
    assert error["kind"] == "worker_exit", error
    assert "authentication" in error["message"] and KEY_VARS["openai"] in error["message"]
    assert "exit 1" not in error["message"]
    # One stream retry, not Codex's default five (each a second or more of backoff).
    assert len(model_server.api_requests("responses")) == 2


def test_a_model_that_never_answers_is_ended_by_the_task_deadline(
    cli,
    repo,
    workdir,
    codex,
    model_server,
):
    spec = _spec(repo, "Wait.\n@hang", limits={"timeout_seconds": 6})
    result = run_task(cli, workdir, spec, codex)
    assert result["status"] == "timed_out", result["error"]
    assert len(model_server.api_requests("responses")) == 1  # it was waiting for the model


def test_read_only_refuses_the_write_and_changes_nothing(
    cli,
    repo,
    workdir,
    codex,
    model_server,
):
    spec = _spec(repo, "Look only.\n@write calc.py: broken\n@say Looked.", permission="read_only")
    result = run_task(cli, workdir, spec, codex)
    assert result["status"] == "succeeded", result["error"]
    assert result["changed_files"] == []
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    progress = [e["data"] for e in events(cli, result["task_id"], codex, "worker.progress")]
    refused = [p for p in progress if p["kind"] == "error" and "calc.py" in p["text"]]
    assert refused, progress
    # Codex was told the task is read-only, and the model was told the write failed.
    last = model_server.api_requests("responses")[-1].body["input"]
    assert "mounted read-only" in json.dumps(last)
    assert "Failed to write file" in last[-1]["output"]


# What Codex 0.171.0 printed when the scripted provider answered so (its JSONL `turn.failed`
# message, or its own `Error:` line on stderr), and the sentence the task's error becomes.
FAILURES = [
    ("exceeded retry limit, last status: 429 Too Many Requests", "rate-limited"),
    ("rate limit exceeded: Rate limit reached for gpt-5.5. Please try again in 1.5s.", "rate"),
    ("Quota exceeded. Check your plan and billing details.", "quota is used up"),
    ("The requested model 'gpt-nope' does not exist.", "does not know the model"),
    (
        "Codex ran out of room in the model's context window. Start a new thread or clear "
        "earlier history before retrying.",
        "context window",
    ),
    ("We’re currently experiencing high demand, which may cause temporary errors.", "server"),
]


@pytest.mark.parametrize(("message", "says"), FAILURES)
def test_each_terminal_failure_says_which(message, says):
    from bridge.workers.codex import CodexWorker

    line = json.dumps({"type": "turn.failed", "error": {"message": message}})
    parsed = CodexWorker().parse_line(line)
    assert parsed.failure and says in parsed.failure, parsed.failure
    resume = "Error: thread/resume: thread/resume failed: no rollout found for thread id x"
    assert "could not resume its session" in (CodexWorker().parse_line(resume).failure or "")
    notice = {"type": "error", "message": f"Reconnecting... 1/1 ({message})"}
    assert CodexWorker().parse_line(json.dumps(notice)).failure is None
