"""OpenCode (`opencode run --format json`) on the gateway's Chat Completions route.

The provider is an `@ai-sdk/openai-compatible` one whose base URL is the gateway's route, so
the sandbox holds only a placeholder key. The settings go in OPENCODE_CONFIG_CONTENT and the
permissions in OPENCODE_PERMISSION. The repository's own OpenCode config (opencode.json,
.opencode/) is not loaded: it could point the CLI elsewhere, and a .opencode/ folder makes
OpenCode write a .gitignore into it and fetch its plugin package from npm; its AGENTS.md is
still given to the model. The image keeps OpenCode's config dir (with the plugin package it
would otherwise download) in the bundle, under /opt/worker-bridge/opencode/config: the per-task
home starts empty. The launch sets XDG_CONFIG_HOME to it itself, because the image's ENV stays
behind when the bundle is mounted into a project's own image.
"""

from __future__ import annotations

import json
import re
from typing import Any

from bridge.config.settings import Config
from bridge.documents import RESUME_FAILED
from bridge.models import JsonObject, json_object
from bridge.workers.base import (
    INPUTS_DIR,
    ParsedLine,
    Progress,
    ProgressKind,
    Turn,
    WorkerLaunch,
)
from bridge.workers.cli import PLACEHOLDER_KEY, CliWorker, json_line, plain

PROVIDER = "worker-bridge"
WORKSPACE = "/workspace/"
# OpenCode's config dir is $XDG_CONFIG_HOME/opencode, in the bundle (images/opencode/Dockerfile).
CONFIG_HOME = "/opt/worker-bridge/opencode/config"
# OpenCode's own background traffic: models.dev catalogue, self-update, built-in plugins from
# npm, language servers, session sharing. Nothing of it can work (or should) in the sandbox.
QUIET_ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",  # (see above; also drops AGENTS.md, given back below)
}
PERMISSIONS = {
    "read_only": {"edit": "deny", "bash": "deny"},  # not even offered (and the mount is read-only)
    "workspace_write": {"edit": "allow", "bash": "allow"},
    "full_access": {
        "edit": "allow",
        "bash": "allow",
        "webfetch": "allow",
        "external_directory": "allow",
        "doom_loop": "allow",
    },
}
FILE_TOOLS = ("write", "edit", "multiedit", "patch", "apply_patch")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class OpencodeWorker(CliWorker):
    name = "opencode"
    image_name = "opencode"
    probe = ("opencode", "--version")
    default_route = "openai"
    session_pattern = r"ses_[A-Za-z0-9]{1,64}"  # OpenCode's session ids
    # accepts `max_tokens`, which OpenCode always sends (OpenAI's reasoning models refuse it
    # on Chat Completions)
    default_model = "gpt-4.1"

    def launch(self, turn: Turn, config: Config) -> WorkerLaunch:
        self.learn_key_env(config)
        model = self.model(turn.metadata, config) or self.default_model
        settings: JsonObject = {
            "model": f"{PROVIDER}/{model}",
            "small_model": f"{PROVIDER}/{model}",
            "enabled_providers": [PROVIDER],
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "worker-bridge gateway",
                    "options": {
                        "baseURL": self.route_url(config) + "/v1",
                        "apiKey": PLACEHOLDER_KEY,
                    },
                    "models": {model: {"name": model, "tool_call": True}},
                }
            },
            "share": "disabled",
            "autoupdate": False,
            # its own git copy of the workspace, for undo: time and disk the bridge does not need
            "snapshot": False,
            "instructions": [f"{WORKSPACE}AGENTS.md"],
        }
        permission = PERMISSIONS.get(turn.permission, PERMISSIONS["workspace_write"])
        # `--title` names the session itself, which saves a model call; the prompt goes on
        # stdin (an argument with spaces reaches the model quoted).
        args = ["--format", "json", "--title", "worker-bridge"]
        if turn.read_only:  # its plan agent tells the model it must not change anything
            args += ["--agent", "plan"]
        if turn.session_id:
            args += ["--session", turn.session_id]
        script = f'exec opencode run "$@" < {INPUTS_DIR}/prompt.txt'
        return WorkerLaunch(
            command=["sh", "-c", script, "opencode", *args],
            env={
                **QUIET_ENV,
                "XDG_CONFIG_HOME": CONFIG_HOME,
                "OPENCODE_CONFIG_CONTENT": json.dumps(settings),
                "OPENCODE_PERMISSION": json.dumps(permission),
            },
            files={"prompt.txt": turn.resumed_prompt if turn.session_id else turn.prompt},
        )

    def parse_line(self, line: str) -> ParsedLine:
        event = json_line(line)
        if event is None:
            text = _ANSI.sub("", line).strip()
            if "Session not found" in text:
                return ParsedLine.message(
                    text,
                    failure=f"OpenCode {RESUME_FAILED} of the earlier turns "
                    "(Session not found); delegate a new task.",
                )
            return plain(text)
        session = event.get("sessionID") if isinstance(event.get("sessionID"), str) else None
        kind = event.get("type")
        part = json_object(event.get("part"))
        if kind == "text" and isinstance(part.get("text"), str) and part["text"].strip():
            text = part["text"].strip()
            return ParsedLine.message(text, summary=text, session_id=session)
        if kind == "tool_use":
            return ParsedLine(progress=[_tool(part)], session_id=session)
        if kind == "error":
            error = json_object(event.get("error"))
            failure = self._failure(error)
            return ParsedLine(
                progress=[Progress("error", failure)], failure=failure, session_id=session
            )
        return ParsedLine(session_id=session)  # step_start, step_finish, reasoning

    def _failure(self, error: JsonObject) -> str:
        """One sentence for OpenCode's terminal error (it exits 1 after one)."""
        name = str(error.get("name") or "error")
        data = json_object(error.get("data"))
        message = _line(data.get("message") or name)
        status = data.get("statusCode")
        body = str(data.get("responseBody") or "")
        if name == "ProviderAuthError" or status in (401, 403) or "invalid_api_key" in body:
            where = self.key_env
            return (
                f"The model provider refused the key (authentication failed); check {where} "
                "on the host."
            )
        if status == 429:
            return (
                f"The model provider rate-limited the task (HTTP 429: {message}); retry later "
                "or check the account's quota."
            )
        if status == 404 or "model_not_found" in body:
            return (
                f"The model provider does not serve the model ({message}); set metadata.model or "
                f"worker_settings.{self.name}.model to one it serves."
            )
        if name == "ContextOverflowError" or "context_length_exceeded" in body:
            return (
                f"The conversation no longer fits the model's context window ({message}); "
                "narrow the task."
            )
        if status:
            return f"The model provider answered HTTP {status} ({message})."
        return f"OpenCode failed ({name}: {message})."


def _tool(part: JsonObject) -> Progress:
    """A tool call as progress: file edits by path, commands by their command line; a call
    that failed or was refused (a tool it was not offered, a permission denied) as an error."""
    tool = str(part.get("tool") or "tool")
    state = json_object(part.get("state"))
    given = json_object(state.get("input"))
    if tool == "invalid":  # OpenCode's stand-in for a call of a tool it did not offer
        return Progress("error", _line(given.get("error")), name=str(given.get("tool") or tool))
    kind: ProgressKind
    if tool == "bash":
        kind, text = "command", str(given.get("command") or state.get("title") or "")
    elif tool in FILE_TOOLS:
        path = str(given.get("filePath") or state.get("title") or "")
        kind, text = "file_edit", path.removeprefix(WORKSPACE)
    else:
        kind, text = "tool", str(state.get("title") or json.dumps(given)[:200])
    if state.get("status") == "error":
        return Progress("error", f"{text}: {_line(state.get('error'))}", name=tool)
    return Progress(kind, text, name=tool)


def _line(text: Any, limit: int = 300) -> str:
    return " ".join(str(text or "").split())[:limit]
