"""The `opencode` worker for real: the OpenCode binary in its built image, run by the engine on
a task, reaching the scripted model server (Chat Completions) only through the task's gateway
(the real key is added on the host). The model's plan is written in each task's text (see
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
def opencode(home, real_env):
    from bridge.config import load_config

    ensure_worker_image(load_config({"WORKER_BRIDGE_HOME": str(home)}), "opencode")
    return real_env


def _spec(repo, objective: str, **extra) -> dict:
    return {
        "objective": objective,
        "worker": "opencode",
        "workspace": {"repository": str(repo)},
        **extra,
    }


def _user_texts(request) -> list[str]:
    from bridge.smoke.apis.chat import API

    return API.conversation(request.body or {}).user_texts


def _tools(request) -> set[str]:
    return {t["function"]["name"] for t in request.body.get("tools") or []}


def test_opencode_writes_with_its_tool_resumes_its_session_and_keeps_the_key_away(
    cli,
    repo,
    workdir,
    home,
    opencode,
    model_server,
):
    # The repository's own OpenCode config is not loaded (it would also make OpenCode write
    # .opencode/.gitignore and fetch a plugin from npm), but its AGENTS.md reaches the model.
    (repo / ".opencode" / "command").mkdir(parents=True)
    (repo / ".opencode" / "command" / "hi.md").write_text("Say hi.\n")
    (repo / "opencode.json").write_text('{"model": "elsewhere/x", "permission": {"edit": "deny"}}')
    (repo / "AGENTS.md").write_text("Project rule MARKER-7: be brief.\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "opencode config")
    objective = (
        "Add a greeting file.\n"
        "@write hello.txt: hello from opencode\n"
        "@follow-write hello.txt: hello from opencode, again\n"
        "@say Wrote hello.txt."
    )
    spec = _spec(repo, objective, verification={"commands": ["grep -q 'hello from' hello.txt"]})
    result = run_task(cli, workdir, spec, opencode)
    task_id = result["task_id"]
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    assert result["summary"] == "Wrote hello.txt."
    assert result["changed_files"] == [{"path": "hello.txt", "change": "added"}]
    assert git(repo, "show", f"{result['branch']}:hello.txt") == "hello from opencode"
    session = result["session_id"]
    assert session and session.startswith("ses_")

    progress = [e["data"] for e in events(cli, task_id, opencode, "worker.progress")]
    assert all(set(p) == {"kind", "text", "name"} for p in progress), progress
    assert {"kind": "file_edit", "text": "hello.txt", "name": "write"} in progress
    assert {"kind": "message", "text": "Wrote hello.txt.", "name": None} in progress

    # Every request offered OpenCode's tools (`--title` spares the title call), and the write
    # tool's result went back to the model.
    first = model_server.api_requests("chat")
    assert len(first) == 2 and all({"write", "edit", "bash"} <= _tools(r) for r in first)
    assert first[0].body["model"] == "gpt-4.1"
    assert "MARKER-7" in first[0].body["messages"][0]["content"]
    assert first[-1].body["messages"][-1] == {
        "role": "tool",
        "tool_call_id": first[-1].body["messages"][-2]["tool_calls"][0]["id"],
        "content": "Wrote file successfully.",
    }

    # A follow-up resumes the same session: the model sees the first turn's messages.
    args = ("tasks", "follow-up", task_id, "Say it again.", "--wait", "--json")
    followed = cli(*args, env=opencode, timeout=300)
    assert followed.code == 0, followed.stderr
    done = json.loads(cli("tasks", "show", task_id, "--json", env=opencode).stdout)
    assert done["status"] == "succeeded", done["error"]
    assert done["session_id"] == session
    later = model_server.api_requests("chat")[len(first) :]
    assert _user_texts(later[0]) == [objective + "\n", "Say it again.\n"]
    assert git(repo, "show", f"{done['branch']}:hello.txt") == "hello from opencode, again"
    started = events(cli, task_id, opencode, "worker.started")
    assert [e["data"]["turn"] for e in started] == [0, 1]

    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in first + later)
    assert_key_nowhere(home)
    assert_only_model_route(cli, task_id, opencode, model_server)


def test_a_failed_verification_gets_a_repair_turn_in_the_same_session(
    cli,
    repo,
    workdir,
    opencode,
    model_server,
):
    objective = "Make the check pass.\n@write f.txt: wrong\n@repair-write f.txt: right\n@say Fixed."
    spec = _spec(repo, objective, verification={"commands": ["grep -q right f.txt"]})
    result = run_task(cli, workdir, spec, opencode)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    assert git(repo, "show", f"{result['branch']}:f.txt") == "right"
    kinds = [e["kind"] for e in events(cli, result["task_id"], opencode)]
    assert kinds.count("worker.started") == 2
    assert kinds.count("verification.auto_repair") == 1
    # The repair turn was sent in the first turn's session, the failure's output with it.
    texts = [_user_texts(r) for r in model_server.api_requests("chat")]
    repair = next(t for t in texts if len(t) > 1)
    assert repair[0] == objective + "\n" and "Verification failed" in repair[1]


def test_a_refused_key_fails_fast_naming_the_variable(
    cli,
    repo,
    workdir,
    opencode,
    model_server,
):
    result = run_task(cli, workdir, _spec(repo, "Do it.\n@fail-auth"), opencode)
    assert result["status"] == "failed"
    error = result["error"]
    assert error["kind"] == "worker_exit", error
    assert "authentication" in error["message"] and KEY_VARS["openai"] in error["message"]
    assert len(model_server.api_requests("chat")) == 1  # a 401 is not retried


def test_a_model_that_never_answers_is_ended_by_the_task_deadline(
    cli,
    repo,
    workdir,
    opencode,
    model_server,
):
    spec = _spec(repo, "Wait.\n@hang", limits={"timeout_seconds": 15})
    result = run_task(cli, workdir, spec, opencode)
    assert result["status"] == "timed_out", result["error"]
    assert len(model_server.api_requests("chat")) == 1  # it was waiting for the model


def test_read_only_refuses_the_write_and_changes_nothing(
    cli,
    repo,
    workdir,
    opencode,
    model_server,
):
    spec = _spec(repo, "Look only.\n@write calc.py: broken\n@say Looked.", permission="read_only")
    result = run_task(cli, workdir, spec, opencode)
    assert result["status"] == "succeeded", result["error"]
    assert result["changed_files"] == []
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    progress = [e["data"] for e in events(cli, result["task_id"], opencode, "worker.progress")]
    assert [p for p in progress if p["kind"] == "error" and p["name"] == "write"], progress
    # OpenCode's plan agent told the model not to change anything, no tool that could was
    # offered, and the model was told its write is unavailable.
    requests = model_server.api_requests("chat")
    assert "MUST NOT make any edits" in json.dumps(requests[0].body["messages"][-1])
    assert all(not ({"write", "edit", "bash"} & _tools(r)) for r in requests)
    assert "unavailable tool 'write'" in requests[-1].body["messages"][-1]["content"]


def _error_line(name: str, message: str, **data) -> str:
    error = {"name": name, "data": {"message": message, **data}}
    return json.dumps({"type": "error", "sessionID": "ses_x", "error": error})


# What OpenCode 1.18.33 printed when the provider answered so (its `error` event, or its own
# line on stderr), and what the task's error says.
FAILURES = [
    (_error_line("APIError", "Incorrect API key provided", statusCode=401), "check OPENAI_API_KEY"),
    (_error_line("APIError", "Rate limit reached for gpt-5.5", statusCode=429), "rate-limited"),
    (
        _error_line("APIError", "The model `nope-1` does not exist", statusCode=404),
        "does not serve the model",
    ),
    (
        _error_line("ContextOverflowError", "This model's maximum context length is 128000"),
        "context window",
    ),
    (_error_line("APIError", "The server had an error", statusCode=500), "HTTP 500"),
    ("\x1b[91m\x1b[1mError: \x1b[0mSession not found", "could not resume its session"),
]


@pytest.mark.parametrize(("line", "says"), FAILURES)
def test_each_terminal_failure_says_which(line, says):
    from bridge.config import load_config
    from bridge.workers.base import Turn
    from bridge.workers.opencode import OpencodeWorker

    worker = OpencodeWorker()
    worker.launch(Turn("x", {}), load_config({"WORKER_BRIDGE_HOME": "/nonexistent"}))
    parsed = worker.parse_line(line)
    assert parsed.failure and says in parsed.failure, parsed.failure
