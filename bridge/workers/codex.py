"""OpenAI's Codex CLI (`codex exec --json`) as a worker.

Codex reaches its model through a custom model provider in `~/.codex/config.toml` (mounted
read-only: Codex only reads it) whose base URL is the gateway's route; the key it holds is a
placeholder that the gateway swaps for the real one on the host. The prompt comes on stdin
(`-`), so no argument length limit applies and Codex does not wait for extra stdin input.

Codex's own sandbox (bubblewrap) cannot start inside our container, which has no user
namespaces: under `--sandbox read-only` every shell command fails, reads included. So every
turn runs with the sandbox off (the container is the sandbox) and a read-only turn relies on
the workspace being mounted read-only: a write attempt fails there and Codex reports the file
change as failed, which becomes an `error` progress event.
"""

from __future__ import annotations

import json
import re
import shlex

from bridge.config.settings import Config
from bridge.documents import RESUME_FAILED
from bridge.models import JsonObject
from bridge.workers.base import INPUTS_DIR, ParsedLine, Progress, Turn, WorkerLaunch
from bridge.workers.cli import PLACEHOLDER_KEY, UUID_PATTERN, CliWorker, json_line, plain

WORKSPACE = "/workspace/"
KEY_VAR = "OPENAI_API_KEY"  # inside the sandbox it holds only the placeholder
READ_ONLY_NOTE = (
    "This task is read-only: /workspace is mounted read-only and no change to it is kept. "
    "Read and run what you need, and answer without editing files."
)
# Codex's own log lines on stderr: `<time> ERROR <target>: <text>`.
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\S+\s+(ERROR|WARN)\s+(\S+):\s+(.*)$")
_STATUS = re.compile(r"unexpected status (\d{3}[A-Za-z ]*)")


class CodexWorker(CliWorker):
    name = "codex"
    image_name = "codex"
    probe = ("codex", "--version")
    default_route = "openai"
    # Codex's thread ids (a resume id of another shape silently starts a new thread)
    session_pattern = UUID_PATTERN
    # A slug Codex knows: its model metadata is what makes it offer the apply_patch tool (an
    # unknown slug gets fallback metadata, a warning, and no apply_patch).
    default_model = "gpt-5.5"

    def launch(self, turn: Turn, config: Config) -> WorkerLaunch:
        self.learn_key_env(config)
        flags = ["--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        model = self.model(turn.metadata, config)
        if model:
            flags += ["--model", model]
        if turn.read_only:
            flags += ["-c", f"developer_instructions={json.dumps(READ_ONLY_NOTE)}"]
        if turn.session_id:
            argv = ["codex", "exec", "resume", *flags, turn.session_id, "-"]
            prompt = turn.resumed_prompt
        else:
            argv = ["codex", "exec", *flags, "-"]
            prompt = turn.prompt
        return WorkerLaunch(
            command=["sh", "-c", f'exec "$@" < {INPUTS_DIR}/prompt.txt', "sh", *argv],
            # Codex logs each failed tool call to stderr as well, several lines long; the JSON
            # stream reports it already (a failed file change, a command's exit code).
            env={KEY_VAR: PLACEHOLDER_KEY, "RUST_LOG": "error,codex_core::tools::router=off"},
            files={"prompt.txt": prompt},
            home_files={".codex/config.toml": self.config_toml(config)},
        )

    def config_toml(self, config: Config) -> str:
        """The provider pointing at the gateway, and Codex's background traffic off: the
        plugin marketplace (github.com, api.github.com, chatgpt.com), analytics
        (ab.chatgpt.com) and the update check. One stream retry only: Codex retries any
        failed stream, a refused key included (5 retries take ~7 s), while HTTP 5xx still get
        its request-level retries."""
        return (
            'model_provider = "worker-bridge"\n'
            "check_for_update_on_startup = false\n\n"
            "[model_providers.worker-bridge]\n"
            'name = "worker-bridge gateway"\n'
            f"base_url = {json.dumps(self.route_url(config) + '/v1')}\n"
            f'env_key = "{KEY_VAR}"\n'
            'wire_api = "responses"\n'
            "stream_max_retries = 1\n\n"
            "[analytics]\nenabled = false\n\n"
            "[features]\nplugins = false\n"
        )

    # -- the JSONL stream -------------------------------------------------------------------

    def parse_line(self, line: str) -> ParsedLine:
        event = json_line(line)
        if event is None:
            return self._plain(line)
        kind = event.get("type")
        if kind == "thread.started":
            return ParsedLine(session_id=str(event.get("thread_id") or "") or None)
        if kind in ("item.started", "item.completed"):
            item = event.get("item")
            return _item(item, kind == "item.completed") if isinstance(item, dict) else ParsedLine()
        if kind == "turn.failed":
            error = event.get("error")
            message = str((error or {}).get("message", "")) if isinstance(error, dict) else ""
            # the `error` line before it showed the message already
            return self._failed(message or "the turn failed", shown=True)
        if kind == "error":
            message = str(event.get("message", ""))
            if message.startswith("Reconnecting..."):  # a retry notice, not the end
                return ParsedLine(progress=[Progress("error", message)])
            return self._failed(message)
        return ParsedLine()  # turn.started, turn.completed (usage: the gateway counts it)

    def _plain(self, line: str) -> ParsedLine:
        text = line.strip()
        if text.startswith("Reading additional input from stdin"):
            return ParsedLine()
        log = _LOG_LINE.match(text)
        if log:
            return ParsedLine(progress=[Progress("error", log.group(3))])
        if text.startswith("Error: "):  # Codex's own fatal error, before or instead of a turn
            return self._failed(text.removeprefix("Error: "))
        return plain(line)

    def _failed(self, message: str, shown: bool = False) -> ParsedLine:
        """A terminal failure: its sentence is the task's error and the turn's summary."""
        failure = self.failure(message)
        progress = [] if shown else [Progress("error", message)]
        return ParsedLine(progress=progress, summary=failure, failure=failure)

    def failure(self, message: str) -> str:
        """Codex's terminal error as one sentence that says which and what to do."""
        low = message.lower()
        status = _STATUS.search(message)
        code = f" ({status.group(1).strip()})" if status else ""
        if code.startswith((" (401", " (403")) or "incorrect api key" in low:
            return (
                f"The model provider refused the key: authentication failed{code}; check "
                f"{self.key_env} on the host."
            )
        if "quota exceeded" in low:
            return (
                f"The key's quota is used up ({message.rstrip('.')}); check the plan and "
                f"billing of the key in {self.key_env}."
            )
        if "429" in message or "rate limit" in low:
            return (
                "The model provider rate-limited Codex and it stopped retrying "
                f"({message.rstrip('.')}); wait, then follow up."
            )
        if "context window" in low or "context_length" in low:
            return (
                "The conversation no longer fits the model's context window; delegate a new "
                "task with a smaller objective."
            )
        if "does not exist" in low or "model_not_found" in low or "model not found" in low:
            return (
                f"The model provider does not know the model ({message.rstrip('.')}); choose "
                "another with metadata.model or worker_settings.codex.model."
            )
        if "high demand" in low or re.search(r"\b5\d\d\b", message):
            return (
                "The model provider kept failing with server errors and Codex stopped retrying "
                f"({message.rstrip('.')}); follow up later."
            )
        if "thread/resume" in low or "no rollout found" in low:
            return f"Codex {RESUME_FAILED} ({message}); delegate a new task."
        return f"Codex failed: {message}"


def _item(item: JsonObject, completed: bool) -> ParsedLine:
    """One thread item: messages and file changes when completed, commands and tool calls
    when started (and again when they fail)."""
    kind = item.get("type")
    failed = item.get("status") in ("failed", "declined")
    if kind == "agent_message":
        text = str(item.get("text", ""))
        return ParsedLine.message(text, summary=text) if completed else ParsedLine()
    if kind == "command_execution":
        command = str(item.get("command", ""))
        name = _program(command)
        if not completed:
            return ParsedLine(progress=[Progress("command", command, name)])
        code = item.get("exit_code")
        if not failed and code in (0, None):
            return ParsedLine()
        # A command that exits non-zero (tests failing) is the command's news, not Codex's.
        output = str(item.get("aggregated_output", ""))[-500:]
        note = f"{command} (exit {code}): {output}".strip()
        return ParsedLine(progress=[Progress("command" if code else "error", note, name)])
    if kind == "file_change":
        if not completed:
            return ParsedLine()
        changes = [c for c in item.get("changes") or [] if isinstance(c, dict)]
        text = ", ".join(
            f"{c.get('kind', 'update')} {str(c.get('path', '')).removeprefix(WORKSPACE)}"
            for c in changes
        )
        if failed:
            return ParsedLine(
                progress=[Progress("error", f"file change failed: {text}", "apply_patch")]
            )
        return ParsedLine(progress=[Progress("file_edit", text, "apply_patch")])
    if kind == "error":  # a warning of Codex's own (e.g. unknown model metadata)
        return ParsedLine(progress=[Progress("error", str(item.get("message", "")))])
    if kind in ("reasoning", "todo_list") or (completed and not failed):
        return ParsedLine()  # reasoning is noise; a tool call was shown when it started
    return ParsedLine(progress=[_tool(item, failed)])


def _tool(item: JsonObject, failed: bool) -> Progress:
    """An MCP tool call, a web search or another tool of Codex's."""
    kind = str(item.get("type", "tool"))
    if kind == "mcp_tool_call":
        name = f"{item.get('server', '')}.{item.get('tool', '')}"
        text = json.dumps(item.get("arguments"), ensure_ascii=False)[:500]
    else:
        name = kind
        text = str(item.get("query") or item.get("text") or kind)
    if failed:
        error = item.get("error")
        detail = error.get("message") if isinstance(error, dict) else error
        return Progress("error", f"{name} failed: {detail or text}", name)
    return Progress("tool", text, name)


def _program(command: str) -> str | None:
    """The program a command runs, looking through Codex's `/bin/sh -lc '...'` wrapper."""
    try:
        words = shlex.split(command)
        if (
            len(words) >= 3
            and words[0].rsplit("/", 1)[-1] in ("sh", "bash", "zsh")
            and words[1] in ("-c", "-lc")
        ):
            words = shlex.split(words[2])
    except ValueError:
        words = command.split()
    return words[0].rsplit("/", 1)[-1] if words else None
