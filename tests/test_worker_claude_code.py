"""The `claude-code` and `zcode-glm` workers for real: the Claude Code binary in its built
image, run by the engine on a task, reaching the scripted model server only through the task's
gateway (the real key is added on the host). The model's plan is written in each task's text
(see bridge/smoke/model_server.py)."""

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
def claude(home, real_env):
    from bridge.config import load_config

    ensure_worker_image(load_config({"WORKER_BRIDGE_HOME": str(home)}), "claude-code")
    return real_env


def _spec(repo, objective: str, worker: str = "claude-code", **extra) -> dict:
    return {
        "objective": objective,
        "worker": worker,
        "workspace": {"repository": str(repo)},
        **extra,
    }


def _user_texts(request) -> list[str]:
    from bridge.smoke.apis.anthropic import API

    return API.conversation(request.body or {}).user_texts


def _progress(cli, task_id: str, env: dict) -> list[dict]:
    return [e["data"] for e in events(cli, task_id, env, "worker.progress")]


def test_claude_code_writes_with_its_tool_resumes_its_session_and_keeps_the_key_away(
    cli,
    repo,
    workdir,
    home,
    claude,
    model_server,
):
    objective = (
        "Add a greeting file.\n"
        "@write hello.txt: hello from claude\n"
        "@follow-write hello.txt: hello from claude, again\n"
        "@say Wrote hello.txt."
    )
    spec = _spec(repo, objective, verification={"commands": ["grep -q hello hello.txt"]})
    result = run_task(cli, workdir, spec, claude)
    task_id = result["task_id"]
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    assert result["summary"] == "Wrote hello.txt."
    assert result["changed_files"] == [{"path": "hello.txt", "change": "added"}]
    assert git(repo, "show", f"{result['branch']}:hello.txt") == "hello from claude"
    session = result["session_id"]
    assert session and len(session) == 36  # Claude Code's session id, a UUID

    progress = _progress(cli, task_id, claude)
    assert all(set(p) == {"kind", "text", "name"} for p in progress), progress
    assert {"kind": "file_edit", "text": "write hello.txt", "name": "Write"} in progress
    assert {"kind": "message", "text": "Wrote hello.txt.", "name": None} in progress

    # The model offered Claude Code's tools and got the Write tool's result back.
    first = model_server.api_requests("anthropic")
    assert {"Write", "Read", "Edit", "Bash"} <= {t.get("name") for t in first[0].body["tools"]}
    last = first[-1].body["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result" and "File created" in json.dumps(last[0])

    # A follow-up resumes the same session: the model sees the first turn's messages.
    followed = cli(
        "tasks", "follow-up", task_id, "Say it again.", "--wait", "--json", env=claude, timeout=300
    )
    assert followed.code == 0, followed.stderr
    done = json.loads(cli("tasks", "show", task_id, "--json", env=claude).stdout)
    assert done["status"] == "succeeded", done["error"]
    assert done["session_id"] == session
    later = model_server.api_requests("anthropic")[len(first) :]
    texts = _user_texts(later[0])
    assert objective in texts[0] and texts[-1] == "Say it again.\n"
    assert git(repo, "show", f"{done['branch']}:hello.txt") == "hello from claude, again"
    started = events(cli, task_id, claude, "worker.started")
    assert [e["data"]["turn"] for e in started] == [0, 1]

    assert all(r.headers["x-api-key"] == KEY for r in first + later)
    assert all(r.path == "/v1/messages?beta=true" for r in first + later)
    assert_key_nowhere(home)
    assert_only_model_route(cli, task_id, claude, model_server)


def test_a_failed_verification_gets_a_repair_turn_in_the_same_session(
    cli,
    repo,
    workdir,
    claude,
    model_server,
):
    objective = "Make the check pass.\n@write f.txt: wrong\n@repair-write f.txt: right\n@say Fixed."
    spec = _spec(repo, objective, verification={"commands": ["grep -q right f.txt"]})
    result = run_task(cli, workdir, spec, claude)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    assert git(repo, "show", f"{result['branch']}:f.txt") == "right"
    kinds = [e["kind"] for e in events(cli, result["task_id"], claude)]
    assert kinds.count("worker.started") == 2
    assert kinds.count("verification.auto_repair") == 1
    # The repair turn was sent in the first turn's session, the failure's output with it.
    texts = [_user_texts(r) for r in model_server.api_requests("anthropic")]
    repair = next(t for t in texts if len(t) > 1)
    assert objective in repair[0] and "Verification failed" in repair[-1]


def test_a_refused_key_fails_naming_authentication_and_the_variable(
    cli,
    repo,
    workdir,
    claude,
    model_server,
):
    result = run_task(cli, workdir, _spec(repo, "Do it.\n@fail-auth"), claude)
    assert result["status"] == "failed"
    error = result["error"]
    assert error["kind"] == "worker_exit", error
    assert "authentication" in error["message"] and KEY_VARS["anthropic"] in error["message"]
    assert "exit 1" not in error["message"]
    # A refused key is final: not Claude Code's ten retries (three minutes of backoff).
    assert len(model_server.api_requests("anthropic")) <= 2


def test_a_model_that_never_answers_is_ended_by_the_task_deadline(
    cli,
    repo,
    workdir,
    claude,
    model_server,
):
    spec = _spec(repo, "Wait.\n@hang", limits={"timeout_seconds": 10})
    result = run_task(cli, workdir, spec, claude)
    assert result["status"] == "timed_out", result["error"]
    assert len(model_server.api_requests("anthropic")) == 1  # it was waiting for the model


def test_read_only_refuses_the_write_and_changes_nothing(
    cli,
    repo,
    workdir,
    claude,
    model_server,
):
    spec = _spec(repo, "Look only.\n@write notes.txt: nope\n@say Looked.", permission="read_only")
    result = run_task(cli, workdir, spec, claude)
    assert result["status"] == "succeeded", result["error"]
    assert result["changed_files"] == []
    assert not (repo / "notes.txt").exists()
    progress = _progress(cli, result["task_id"], claude)
    refused = [p for p in progress if p["kind"] == "error" and "notes.txt" in p["text"]]
    assert refused and refused[0]["name"] == "Write", progress
    # Claude Code refused it itself (plan mode), and told the model so.
    last = model_server.api_requests("anthropic")[-1].body["messages"][-1]["content"][0]
    assert last["is_error"] is True and "plan mode" in json.dumps(last)


def test_zcode_glm_is_claude_code_on_the_zai_route_with_glm_models(
    cli,
    repo,
    workdir,
    home,
    claude,
    model_server,
):
    objective = "Add a file.\n@write glm.txt: hello from glm\n@say Wrote glm.txt."
    spec = _spec(repo, objective, "zcode-glm", verification={"commands": ["grep -q glm glm.txt"]})
    result = run_task(cli, workdir, spec, claude)
    assert result["status"] == "succeeded", result["error"]
    assert result["summary"] == "Wrote glm.txt."
    assert git(repo, "show", f"{result['branch']}:glm.txt") == "hello from glm"
    seen = model_server.api_requests("anthropic")
    assert seen and all(r.headers["authorization"] == f"Bearer {KEY}" for r in seen)
    assert "x-api-key" not in seen[0].headers
    assert {r.body["model"] for r in seen} == {"glm-4.6"}
    assert_key_nowhere(home)
    assert_only_model_route(cli, result["task_id"], claude, model_server)


def test_a_claude_subscription_token_stays_on_the_host(
    cli,
    repo,
    workdir,
    home,
    claude,
    model_server,
):
    """The claude-subscription route: Claude Code inside holds a placeholder subscription token
    (so it speaks the subscription's protocol); the gateway adds the host's real one."""
    config = home / "config.yaml"
    config.write_text(
        config.read_text() + "worker_settings:\n  claude-code: {route: claude-subscription}\n"
    )
    objective = "Add a file.\n@write sub.txt: hello from a subscription\n@say Wrote sub.txt."
    result = run_task(cli, workdir, _spec(repo, objective), claude)
    assert result["status"] == "succeeded", result["error"]
    seen = model_server.api_requests("anthropic")
    assert seen and all(r.headers["authorization"] == f"Bearer {KEY}" for r in seen)
    assert "x-api-key" not in seen[0].headers
    assert "oauth" in seen[0].headers.get("anthropic-beta", "")  # the subscription's protocol
    assert_key_nowhere(home)
    assert_only_model_route(cli, result["task_id"], claude, model_server)


# -- without the engine: the command line and the failure sentences ---------------------------


def test_launch_maps_permissions_sessions_and_models(tmp_path):
    from bridge.config import load_config
    from bridge.workers import Turn
    from bridge.workers.claude_code import ClaudeCodeWorker, ZcodeGlmWorker

    (tmp_path / "config.yaml").write_text("worker_settings:\n  zcode-glm:\n    model: glm-4.5\n")
    config = load_config({"WORKER_BRIDGE_HOME": str(tmp_path)})
    first = ClaudeCodeWorker().launch(Turn("Do it.", {}), config)
    assert "--dangerously-skip-permissions" in first.command and "--resume" not in first.command
    assert first.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:7800/anthropic"
    assert first.env["ANTHROPIC_API_KEY"] == "worker-bridge-placeholder"
    assert first.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert "ANTHROPIC_MODEL" not in first.env  # Claude Code's own default
    assert first.files == {"prompt.txt": "Do it.\n"} and first.home_files == {}

    turn = Turn("Do it.", {}, 1, "More.", "abc", permission="read_only")
    later = ClaudeCodeWorker().launch(turn, config)
    assert later.command[-4:] == ["--permission-mode", "plan", "--resume", "abc"]
    assert later.files == {"prompt.txt": "More.\n"}

    glm = ZcodeGlmWorker().launch(Turn("Do it.", {}), config)
    assert glm.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:7800/zai"
    assert glm.env["ANTHROPIC_AUTH_TOKEN"] == "worker-bridge-placeholder"
    assert "ANTHROPIC_API_KEY" not in glm.env
    assert glm.env["ANTHROPIC_MODEL"] == glm.env["ANTHROPIC_SMALL_FAST_MODEL"] == "glm-4.5"
    chosen = ZcodeGlmWorker().launch(Turn("Do it.", {"model": "glm-4.6"}), config)
    assert chosen.env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "glm-4.6"


# The result lines Claude Code 2.1.332 printed when the scripted provider answered so, and the
# sentence the task's error becomes.
FAILURES = [
    ({"api_error_status": 401, "result": "Invalid API key · Fix external API key"}, "key"),
    (
        {
            "api_error_status": 429,
            "api_error_type": "rate_limit_error",
            "result": "API Error: Request rejected (429) · Number of request tokens has exceeded "
            "your per-minute rate limit",
        },
        "rate-limited",
    ),
    (
        {
            "api_error_status": 404,
            "api_error_type": "not_found_error",
            "result": "There's an issue with the selected model (glm-9). It may not exist or you "
            "may not have access to it. Run --model to pick a different model.",
        },
        "does not know the model",
    ),
    (
        {
            "api_error_status": 400,
            "terminal_reason": "prompt_too_long",
            "result": "Prompt is too long · the request is ~250000 tokens (limit 200000)",
        },
        "context window",
    ),
    (
        {"api_error_status": 400, "result": "Credit balance is too low"},
        "credit is used up",
    ),
    (
        {
            "api_error_status": 529,
            "api_error_type": "overloaded_error",
            "result": "API Error: 529 Overloaded. This is a server-side issue, usually temporary",
        },
        "server errors",
    ),
    (
        {
            "subtype": "error_during_execution",
            "errors": ["No conversation found with session ID: 1111"],
        },
        "could not resume its session",
    ),
]


@pytest.mark.parametrize(("fields", "says"), FAILURES)
def test_each_terminal_failure_says_which(fields, says):
    from bridge.workers.claude_code import ClaudeCodeWorker

    line = {"type": "result", "subtype": "success", "is_error": True, "session_id": "s", **fields}
    parsed = ClaudeCodeWorker().parse_line(json.dumps(line))
    assert parsed.failure and says in parsed.failure, parsed.failure
    assert parsed.summary == parsed.failure and parsed.session_id == "s"
    ok = {"type": "result", "subtype": "success", "is_error": False, "result": "Done."}
    assert ClaudeCodeWorker().parse_line(json.dumps(ok)).failure is None
