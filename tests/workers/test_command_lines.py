"""The built-in CLIs without the engine: the command line and environment each turn launches
(permissions, sessions, models, routes), and the one sentence each terminal failure the CLI
printed becomes in the task's error. The lines are what the real CLIs printed against the
scripted provider; the CLIs themselves run in tests/real/test_workers.py."""

from __future__ import annotations

import json

import pytest

# -- Claude Code and zcode-glm -----------------------------------------------------------------


def test_a_claude_code_or_zcode_glm_turn_maps_permissions_sessions_and_models(tmp_path):
    from bridge.config.settings import load_config
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
    assert first.files == {"prompt.txt": Turn("Do it.", {}).prompt} and first.home_files == {}
    assert (
        first.files["prompt.txt"].startswith("Do it.\n")
        and "worker-bridge-request" in (first.files["prompt.txt"])
    )

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
CLAUDE_CODE_FAILURES = [
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


@pytest.mark.parametrize(("fields", "says"), CLAUDE_CODE_FAILURES)
def test_each_terminal_failure_of_claude_code_says_which(fields, says):
    from bridge.workers.claude_code import ClaudeCodeWorker

    line = {"type": "result", "subtype": "success", "is_error": True, "session_id": "s", **fields}
    parsed = ClaudeCodeWorker().parse_line(json.dumps(line))
    assert parsed.failure and says in parsed.failure, parsed.failure
    assert parsed.summary == parsed.failure and parsed.session_id == "s"
    ok = {"type": "result", "subtype": "success", "is_error": False, "result": "Done."}
    assert ClaudeCodeWorker().parse_line(json.dumps(ok)).failure is None


# -- Codex -------------------------------------------------------------------------------------


# What Codex 0.171.0 printed when the scripted provider answered so (its JSONL `turn.failed`
# message, or its own `Error:` line on stderr), and the sentence the task's error becomes.
CODEX_FAILURES = [
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


@pytest.mark.parametrize(("message", "says"), CODEX_FAILURES)
def test_each_terminal_failure_of_codex_says_which(message, says):
    from bridge.workers.codex import CodexWorker

    line = json.dumps({"type": "turn.failed", "error": {"message": message}})
    parsed = CodexWorker().parse_line(line)
    assert parsed.failure and says in parsed.failure, parsed.failure
    resume = "Error: thread/resume: thread/resume failed: no rollout found for thread id x"
    assert "could not resume its session" in (CodexWorker().parse_line(resume).failure or "")
    notice = {"type": "error", "message": f"Reconnecting... 1/1 ({message})"}
    assert CodexWorker().parse_line(json.dumps(notice)).failure is None


# -- OpenCode ----------------------------------------------------------------------------------


def _error_line(name: str, message: str, **data) -> str:
    error = {"name": name, "data": {"message": message, **data}}
    return json.dumps({"type": "error", "sessionID": "ses_x", "error": error})


# What OpenCode 1.18.33 printed when the provider answered so (its `error` event, or its own
# line on stderr), and what the task's error says.
OPENCODE_FAILURES = [
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


@pytest.mark.parametrize(("line", "says"), OPENCODE_FAILURES)
def test_each_terminal_failure_of_opencode_says_which(line, says):
    from bridge.config.settings import load_config
    from bridge.workers.base import Turn
    from bridge.workers.opencode import OpencodeWorker

    worker = OpencodeWorker()
    worker.launch(Turn("x", {}), load_config({"WORKER_BRIDGE_HOME": "/nonexistent"}))
    parsed = worker.parse_line(line)
    assert parsed.failure and says in parsed.failure, parsed.failure
