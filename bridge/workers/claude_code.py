"""Claude Code (`claude -p --output-format stream-json`) as a worker, and zcode-glm: the same
CLI on an Anthropic-compatible route (Z.ai's GLM models by default).

Claude Code reaches its model at ``ANTHROPIC_BASE_URL`` (the gateway's route) with a
placeholder key that the gateway swaps for the real one on the host; it needs no config or
onboarding file to run headless, so nothing is mounted into its home, which keeps its
sessions (``~/.claude/projects/``) across the task's turns. The prompt comes on stdin, so no
argument length limit applies. The container is the sandbox: a writing turn skips Claude
Code's permission prompts (nobody could answer them), and a read-only turn runs in plan mode,
where Claude Code refuses every edit itself (the workspace is also mounted read-only).

Claude Code 2.1.332 retries a 401 ten times (about three minutes of backoff) unless the
answer carries ``x-should-retry: false``; a key refused on a gateway route is final, so the
gateway must say so. It retries 429 and 5xx answers the same way; its retry notices become
`error` progress events.
"""

from __future__ import annotations

import json

from bridge.config.settings import Config
from bridge.documents import RESUME_FAILED
from bridge.models import JsonObject, json_object
from bridge.workers.base import INPUTS_DIR, ParsedLine, Progress, Turn, WorkerLaunch
from bridge.workers.cli import PLACEHOLDER_KEY, UUID_PATTERN, CliWorker, json_line, plain

WORKSPACE = "/workspace/"
SUBSCRIPTION_ROUTE = "claude-subscription"  # a Claude Pro/Max token (`claude setup-token`)
# Claude Code's calls home (telemetry, error reports, the update check, feature flags): off.
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
EDIT_TOOLS = {"Write": "write", "Edit": "edit", "MultiEdit": "edit", "NotebookEdit": "edit"}
# The input field that says best what a tool call is about, in order of preference.
_ABOUT = ("file_path", "notebook_path", "path", "pattern", "url", "query", "description", "prompt")


class ClaudeCodeWorker(CliWorker):
    name = "claude-code"
    image_name = "claude-code"
    probe = ("claude", "--version")
    default_route = "anthropic"
    session_pattern = UUID_PATTERN  # Claude Code's session ids
    key_var = "ANTHROPIC_API_KEY"  # inside the sandbox it holds only the placeholder

    def launch(self, turn: Turn, config: Config) -> WorkerLaunch:
        self.learn_key_env(config)
        argv = ["claude", "-p", "--output-format", "stream-json", "--verbose"]
        if turn.read_only:
            argv += ["--permission-mode", "plan"]
        else:
            argv += ["--dangerously-skip-permissions"]
        if turn.session_id:
            argv += ["--resume", turn.session_id]
        env = {
            "ANTHROPIC_BASE_URL": self.route_url(config),
            self.sandbox_key_var(config): PLACEHOLDER_KEY,
            "IS_SANDBOX": "1",  # lets --dangerously-skip-permissions run as root too
            **QUIET,
            **self.model_env(self.model(turn.metadata, config)),
        }
        return WorkerLaunch(
            command=["sh", "-c", f'exec "$@" < {INPUTS_DIR}/prompt.txt', "sh", *argv],
            env=env,
            files={"prompt.txt": turn.resumed_prompt if turn.session_id else turn.prompt},
        )

    def sandbox_key_var(self, config: Config) -> str:
        """Where the sandbox's placeholder goes. On the `claude-subscription` route Claude Code
        must believe it holds a subscription token, so it speaks that protocol (bearer and the
        OAuth beta); the real token is the host's, added by the gateway."""
        if self.route(config) == SUBSCRIPTION_ROUTE:
            return "CLAUDE_CODE_OAUTH_TOKEN"
        return self.key_var

    def model_env(self, model: str | None) -> dict[str, str]:
        return {"ANTHROPIC_MODEL": model} if model else {}

    # -- the stream-json lines --------------------------------------------------------------

    def parse_line(self, line: str) -> ParsedLine:
        event = json_line(line)
        if event is None:
            return plain(line)
        session = str(event.get("session_id") or "") or None
        kind = event.get("type")
        if kind == "assistant":
            parsed = self._assistant(event)
        elif kind == "user":
            parsed = ParsedLine(progress=_tool_errors(event))
        elif kind == "system":
            parsed = ParsedLine(progress=_system(event))
        elif kind == "result":
            parsed = self._result(event)
        else:
            parsed = ParsedLine()
        parsed.session_id = session
        return parsed

    def _assistant(self, event: JsonObject) -> ParsedLine:
        message = event.get("message")
        blocks = message.get("content") if isinstance(message, dict) else None
        blocks = [b for b in blocks or [] if isinstance(b, dict)]
        text = "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        if event.get("is_api_error_message"):  # Claude Code's own account of a failed request
            return ParsedLine(progress=[Progress("error", text)])
        progress = [Progress("message", text)] if text.strip() else []
        progress += [_tool_use(b) for b in blocks if b.get("type") == "tool_use"]
        return ParsedLine(progress=progress, summary=text if text.strip() else None)

    def _result(self, event: JsonObject) -> ParsedLine:
        text = str(event.get("result") or "")
        if not event.get("is_error") and not str(event.get("subtype", "")).startswith("error"):
            return ParsedLine(summary=text)
        errors = [str(e) for e in event.get("errors") or []]
        failure = self.failure(text or "; ".join(errors) or "it stopped with an error", event)
        return ParsedLine(
            progress=[Progress("error", "; ".join(errors))] if errors else [],
            summary=failure,
            failure=failure,
        )

    def failure(self, message: str, event: JsonObject) -> str:
        """The result line of a failed run as one sentence that says which and what to do."""
        status = event.get("api_error_status")
        kind = str(event.get("api_error_type") or "")
        low = message.lower()
        said = message.rstrip(".")
        if status in (401, 403) or kind in ("authentication_error", "permission_error"):
            return (
                f"The model route refused the key (authentication failed, HTTP {status}: "
                f"{said}); check {self.key_env} on the host."
            )
        if status == 429 or kind == "rate_limit_error":
            return (
                f"The model provider rate-limited Claude Code and it stopped retrying ({said}); "
                "wait, then follow up."
            )
        if "credit balance" in low or kind == "billing_error":
            return f"The key's credit is used up ({said}); check the billing of {self.key_env}."
        if status == 404 or kind == "not_found_error" or "selected model" in low:
            return (
                f"The model provider does not know the model ({said}); choose another with "
                f"metadata.model or worker_settings.{self.name}.model."
            )
        if event.get("terminal_reason") == "prompt_too_long" or "prompt is too long" in low:
            return (
                "The conversation no longer fits the model's context window; delegate a new "
                "task with a smaller objective."
            )
        if isinstance(status, int) and status >= 500:
            return (
                f"The model provider kept failing with server errors and Claude Code stopped "
                f"retrying ({said}); follow up later."
            )
        if "no conversation found" in low or "--resume" in message:
            return f"Claude Code {RESUME_FAILED} ({said}); delegate a new task."
        return f"Claude Code failed: {said}."


class ZcodeGlmWorker(ClaudeCodeWorker):
    """Claude Code on Z.ai's Anthropic-compatible API: a bearer token, GLM as every model Claude
    Code asks for (its main, small/fast and subagent models), and no pre-release betas, which
    an Anthropic-compatible provider may refuse."""

    name = "zcode-glm"
    default_route = "zai"
    default_model = "glm-4.6"
    key_var = "ANTHROPIC_AUTH_TOKEN"

    def model_env(self, model: str | None) -> dict[str, str]:
        names = (
            "ANTHROPIC_MODEL",
            "ANTHROPIC_SMALL_FAST_MODEL",
            "ANTHROPIC_DEFAULT_OPUS_MODEL",
            "ANTHROPIC_DEFAULT_SONNET_MODEL",
            "ANTHROPIC_DEFAULT_HAIKU_MODEL",
            "CLAUDE_CODE_SUBAGENT_MODEL",
        )
        chosen = {name: model for name in names} if model else {}
        return {**chosen, "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1"}

    def parse_line(self, line: str) -> ParsedLine:
        if line.startswith("[claude-code:unrecognized_model]"):
            return ParsedLine()  # its stderr note on every run: GLM is not a model it knows
        return super().parse_line(line)


def _tool_use(block: JsonObject) -> Progress:
    """A tool call: a shell command, a file edit, or another tool, with what it is about."""
    name = str(block.get("name") or "tool")
    args = json_object(block.get("input"))
    if name == "Bash":
        return Progress("command", str(args.get("command", "")), name)
    about = next((str(args[k]) for k in _ABOUT if args.get(k)), None)
    if about is None:
        about = json.dumps(args, ensure_ascii=False)[:300]
    about = about.removeprefix(WORKSPACE)
    if name in EDIT_TOOLS:
        return Progress("file_edit", f"{EDIT_TOOLS[name]} {about}", name)
    return Progress("tool", about, name)


def _tool_errors(event: JsonObject) -> list[Progress]:
    """The failed tool results of a user line (a successful one is no news)."""
    message = event.get("message")
    blocks = message.get("content") if isinstance(message, dict) else None
    meta = [m for m in event.get("tool_result_meta") or [] if isinstance(m, dict)]
    # a refused call was shown already, by its `permission_denied` line
    refused = {
        m.get("id")
        for m in meta
        if (m.get("permission_decision") or {}).get("decision") == "reject"
    }
    found = []
    for block in blocks if isinstance(blocks, list) else []:
        if not isinstance(block, dict) or block.get("tool_use_id") in refused:
            continue
        if block.get("type") == "tool_result" and block.get("is_error"):
            content = block.get("content")
            if isinstance(content, list):
                content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
            found.append(Progress("error", str(content)[-500:]))
    return found


def _system(event: JsonObject) -> list[Progress]:
    """A retry notice or a refused tool call; init and other notices are no news."""
    subtype = event.get("subtype")
    if subtype == "api_retry":
        delay = (event.get("retry_delay_ms") or 0) / 1000
        text = (
            f"model request failed (HTTP {event.get('error_status')}, {event.get('error')}); "
            f"retry {event.get('attempt')}/{event.get('max_retries')} in {delay:.1f} s"
        )
        return [Progress("error", text)]
    if subtype == "permission_denied":
        return [Progress("error", str(event.get("message", "")), event.get("tool_name"))]
    return []
