"""The built-in workers for real: each CLI's binary (Claude Code, Codex, OpenCode) in its built
image, run by the engine on a task, reaching the scripted model server only through the task's
gateway (the real key is added on the host). The model's plan is written in each task's text
(see bridge/smoke/model_server.py).

What every CLI must do is one test run once per CLI; what a CLI does its own way (the tool it
writes with, what its session id looks like, how it refuses a write and tells the model, what a
refused key costs) is written once, in its profile below. What only one CLI has (zcode-glm and
the subscription route of Claude Code) are tests of their own. How each CLI's output lines are
read, without the engine: tests/workers/test_command_lines.py."""

from __future__ import annotations

import importlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.real_workers import (
    AUTH,
    KEY,
    KEY_VARS,
    assert_key_nowhere,
    assert_only_model_route,
    ensure_worker_image,
)
from support.repos import commit_all, git
from support.tasks import run_spec, task_events

from bridge.workers import Turn

pytestmark = pytest.mark.usefixtures("docker_images")


@dataclass(frozen=True)
class RealCli:
    """What one CLI does its own way, for the tests every CLI shares."""

    worker: str
    api: str  # the scripted server's API it speaks (bridge/smoke/apis/)
    route: str  # its model route: a refused key names this route's key variable
    eol: str  # what the CLI's write puts after a one-line file's text
    session_looks_right: Callable[[str], bool]
    file_edit: dict  # the progress event of its write of hello.txt
    exact_turns: bool  # the model sees the user's turns as sent (not with context added)
    refused_key_requests: range  # how many requests a refused key costs (its retries)
    hang_timeout_s: int  # a task deadline past the CLI's start-up
    first_turn: Callable[[list], None]  # its first turn's requests: tools offered, result back
    read_only: Callable[[list[dict], list], None]  # how it refused a write, and told the model
    read_only_target: str = "calc.py"  # the file a read-only task tries to write
    prepare: Callable[[Path], None] = lambda repo: None  # the repository, before the first task
    request_path: str | None = None  # the path of every model request, where it is fixed

    def spec(self, repo: Path, objective: str, worker: str | None = None, **extra) -> dict:
        """A task for this CLI (or WORKER, another worker on its image) on REPO."""
        where = {"repository": str(repo)}
        return {
            "objective": objective,
            "worker": worker or self.worker,
            "workspace": where,
            **extra,
        }

    @property
    def auth(self) -> tuple[str, str]:
        """The credential header the gateway adds on the host for its route, and its value."""
        if AUTH[self.route] == "x-api-key":
            return "x-api-key", KEY
        return "authorization", f"Bearer {KEY}"

    def user_texts(self, request) -> list[str]:
        api = importlib.import_module(f"bridge.smoke.apis.{self.api}").API
        return api.conversation(request.body or {}).user_texts

    def requests(self, server) -> list:
        return server.api_requests(self.api)


def _is_uuid(session: str) -> bool:
    return len(session) == 36 and str(uuid.UUID(session)) == session.lower()


# -- Claude Code -------------------------------------------------------------------------------


def _claude_first_turn(first: list) -> None:
    # The model offered Claude Code's tools and got the Write tool's result back.
    assert {"Write", "Read", "Edit", "Bash"} <= {t.get("name") for t in first[0].body["tools"]}
    last = first[-1].body["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result" and "File created" in json.dumps(last[0])


def _claude_read_only(progress: list[dict], requests: list) -> None:
    refused = [p for p in progress if p["kind"] == "error" and "notes.txt" in p["text"]]
    assert refused and refused[0]["name"] == "Write", progress
    # Claude Code refused it itself (plan mode), and told the model so.
    last = requests[-1].body["messages"][-1]["content"][0]
    assert last["is_error"] is True and "plan mode" in json.dumps(last)


CLAUDE_CODE = RealCli(
    worker="claude-code",
    api="anthropic",
    route="anthropic",
    eol="",
    session_looks_right=_is_uuid,
    file_edit={"kind": "file_edit", "text": "write hello.txt", "name": "Write"},
    exact_turns=False,  # Claude Code adds its own context to the first turn's text
    refused_key_requests=range(0, 3),  # final: not Claude Code's ten retries (3 min of backoff)
    hang_timeout_s=10,
    first_turn=_claude_first_turn,
    read_only=_claude_read_only,
    read_only_target="notes.txt",
    request_path="/v1/messages?beta=true",
)


# -- Codex -------------------------------------------------------------------------------------


def _codex_first_turn(first: list) -> None:
    # The model was asked with apply_patch on offer, and got its patch's result back.
    assert "apply_patch" in {t.get("name") for t in first[0].body["tools"]}
    assert first[-1].body["input"][-1]["type"] == "custom_tool_call_output"
    assert "Success" in first[-1].body["input"][-1]["output"]


def _codex_read_only(progress: list[dict], requests: list) -> None:
    refused = [p for p in progress if p["kind"] == "error" and "calc.py" in p["text"]]
    assert refused, progress
    # Codex was told the task is read-only, and the model was told the write failed.
    last = requests[-1].body["input"]
    assert "mounted read-only" in json.dumps(last)
    assert "Failed to write file" in last[-1]["output"]


CODEX = RealCli(
    worker="codex",
    api="responses",
    route="openai",
    eol="\n",
    session_looks_right=_is_uuid,  # its thread id
    file_edit={"kind": "file_edit", "text": "add hello.txt", "name": "apply_patch"},
    exact_turns=True,
    refused_key_requests=range(2, 3),  # one stream retry, not Codex's default five
    hang_timeout_s=6,
    first_turn=_codex_first_turn,
    read_only=_codex_read_only,
)


# -- OpenCode ----------------------------------------------------------------------------------


def _tools(request) -> set[str]:
    return {t["function"]["name"] for t in request.body.get("tools") or []}


def _opencode_project_config(repo: Path) -> None:
    # The repository's own OpenCode config is not loaded (it would also make OpenCode write
    # .opencode/.gitignore and fetch a plugin from npm), but its AGENTS.md reaches the model.
    (repo / ".opencode" / "command").mkdir(parents=True)
    (repo / ".opencode" / "command" / "hi.md").write_text("Say hi.\n")
    (repo / "opencode.json").write_text('{"model": "elsewhere/x", "permission": {"edit": "deny"}}')
    (repo / "AGENTS.md").write_text("Project rule MARKER-7: be brief.\n")
    commit_all(repo, "opencode config")


def _opencode_first_turn(first: list) -> None:
    # Every request offered OpenCode's tools (`--title` spares the title call), the model is
    # the one configured here (not the repository's), the repository's AGENTS.md reached the
    # model, and the write tool's result went back to it.
    assert len(first) == 2 and all({"write", "edit", "bash"} <= _tools(r) for r in first)
    assert first[0].body["model"] == "gpt-4.1"
    assert "MARKER-7" in first[0].body["messages"][0]["content"]
    assert first[-1].body["messages"][-1] == {
        "role": "tool",
        "tool_call_id": first[-1].body["messages"][-2]["tool_calls"][0]["id"],
        "content": "Wrote file successfully.",
    }


def _opencode_read_only(progress: list[dict], requests: list) -> None:
    assert [p for p in progress if p["kind"] == "error" and p["name"] == "write"], progress
    # OpenCode's plan agent told the model not to change anything, no tool that could was
    # offered, and the model was told its write is unavailable.
    assert "MUST NOT make any edits" in json.dumps(requests[0].body["messages"][-1])
    assert all(not ({"write", "edit", "bash"} & _tools(r)) for r in requests)
    assert "unavailable tool 'write'" in requests[-1].body["messages"][-1]["content"]


OPENCODE = RealCli(
    worker="opencode",
    api="chat",
    route="openai",
    eol="",
    session_looks_right=lambda session: session.startswith("ses_"),
    file_edit={"kind": "file_edit", "text": "hello.txt", "name": "write"},
    exact_turns=True,
    refused_key_requests=range(1, 2),  # a 401 is not retried
    hang_timeout_s=15,
    first_turn=_opencode_first_turn,
    read_only=_opencode_read_only,
    prepare=_opencode_project_config,
)


@pytest.fixture(params=[CLAUDE_CODE, CODEX, OPENCODE], ids=lambda real: real.worker)
def real(request, home: Path, real_env: dict[str, str]) -> RealCli:
    """One CLI, its image built (once per session), its model routes leading to the scripted
    server (the key variables are in real_env)."""
    from bridge.config.settings import load_config

    ensure_worker_image(load_config({"WORKER_BRIDGE_HOME": str(home)}), request.param.worker)
    return request.param


def _progress(cli, task_id: str, env: dict) -> list[dict]:
    return [e["data"] for e in task_events(cli, task_id, env, "worker.progress")]


# -- what every CLI does -----------------------------------------------------------------------


def test_the_cli_writes_with_its_tool_resumes_its_session_and_keeps_the_key_away(
    cli, repo, workdir, home, real, real_env, model_server
):
    real.prepare(repo)
    objective = (
        "Add a greeting file.\n"
        f"@write hello.txt: hello from {real.worker}\n"
        f"@follow-write hello.txt: hello from {real.worker}, again\n"
        "@say Wrote hello.txt."
    )
    verification = {"commands": ["grep -q 'hello from' hello.txt"]}
    result = run_spec(cli, workdir, real.spec(repo, objective, verification=verification), real_env)
    task_id = result["task_id"]
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    assert result["summary"] == "Wrote hello.txt."
    assert result["changed_files"] == [{"path": "hello.txt", "change": "added"}]
    written = git(repo, "show", f"{result['branch']}:hello.txt")
    assert written == f"hello from {real.worker}{real.eol}"
    session = result["session_id"]
    assert session and real.session_looks_right(session), session

    progress = _progress(cli, task_id, real_env)
    assert all(set(p) == {"kind", "text", "name"} for p in progress), progress
    assert real.file_edit in progress
    assert {"kind": "message", "text": "Wrote hello.txt.", "name": None} in progress
    first = real.requests(model_server)
    real.first_turn(first)

    # A follow-up resumes the same session: the model sees the first turn's messages.
    args = ("tasks", "follow-up", task_id, "Say it again.", "--wait", "--json")
    followed = cli(*args, env=real_env, timeout=300)
    assert followed.code == 0, followed.stderr
    done = json.loads(cli("tasks", "show", task_id, "--json", env=real_env).stdout)
    assert done["status"] == "succeeded", done["error"]
    assert done["session_id"] == session
    later = real.requests(model_server)[len(first) :]
    texts = real.user_texts(later[0])
    if real.exact_turns:
        assert texts == [Turn(objective, {}).prompt, "Say it again.\n"]
    else:
        assert objective in texts[0] and texts[-1] == "Say it again.\n"
    again = f"hello from {real.worker}, again{real.eol}"
    assert git(repo, "show", f"{done['branch']}:hello.txt") == again
    started = task_events(cli, task_id, real_env, "worker.started")
    assert [e["data"]["turn"] for e in started] == [0, 1]

    header, value = real.auth
    assert all(r.headers[header] == value for r in first + later)
    if real.request_path is not None:
        assert all(r.path == real.request_path for r in first + later)
    assert_key_nowhere(home)
    assert_only_model_route(cli, task_id, real_env, model_server)


def test_a_failed_verification_gets_a_repair_turn_in_the_same_session(
    cli, repo, workdir, real, real_env, model_server
):
    objective = "Make the check pass.\n@write f.txt: wrong\n@repair-write f.txt: right\n@say Fixed."
    spec = real.spec(repo, objective, verification={"commands": ["grep -q right f.txt"]})
    result = run_spec(cli, workdir, spec, real_env)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    assert git(repo, "show", f"{result['branch']}:f.txt") == "right" + real.eol
    kinds = [e["kind"] for e in task_events(cli, result["task_id"], real_env)]
    assert kinds.count("worker.started") == 2
    assert kinds.count("verification.auto_repair") == 1
    # The repair turn was sent in the first turn's session, the failure's output with it.
    texts = [real.user_texts(r) for r in real.requests(model_server)]
    repair = next(t for t in texts if len(t) > 1)
    if real.exact_turns:
        assert repair[0] == Turn(objective, {}).prompt and "Verification failed" in repair[1]
    else:
        assert objective in repair[0] and "Verification failed" in repair[-1]


def test_a_refused_key_fails_at_once_naming_authentication_and_the_variable(
    cli, repo, workdir, real, real_env, model_server
):
    result = run_spec(cli, workdir, real.spec(repo, "Do it.\n@fail-auth"), real_env)
    assert result["status"] == "failed"
    error = result["error"]
    assert error["kind"] == "worker_exit", error
    assert "authentication" in error["message"] and KEY_VARS[real.route] in error["message"]
    assert "exit 1" not in error["message"]
    assert len(real.requests(model_server)) in real.refused_key_requests


def test_a_model_that_never_answers_is_ended_by_the_task_deadline(
    cli, repo, workdir, real, real_env, model_server
):
    limits = {"timeout_seconds": real.hang_timeout_s}
    result = run_spec(cli, workdir, real.spec(repo, "Wait.\n@hang", limits=limits), real_env)
    assert result["status"] == "timed_out", result["error"]
    assert len(real.requests(model_server)) == 1  # it was waiting for the model


def test_read_only_refuses_the_write_and_changes_nothing(
    cli, repo, workdir, real, real_env, model_server
):
    target = repo / real.read_only_target
    before = target.read_text() if target.exists() else None
    objective = f"Look only.\n@write {real.read_only_target}: broken\n@say Looked."
    spec = real.spec(repo, objective, permission="read_only")
    result = run_spec(cli, workdir, spec, real_env)
    assert result["status"] == "succeeded", result["error"]
    assert result["changed_files"] == []
    assert (target.read_text() if target.exists() else None) == before
    real.read_only(_progress(cli, result["task_id"], real_env), real.requests(model_server))


# -- what only Claude Code has -----------------------------------------------------------------


only_claude_code = pytest.mark.parametrize(
    "real", [CLAUDE_CODE], indirect=True, ids=["claude-code"]
)


@only_claude_code
def test_zcode_glm_is_claude_code_on_the_zai_route_with_glm_models(
    cli, repo, workdir, home, real, real_env, model_server
):
    objective = "Add a file.\n@write glm.txt: hello from glm\n@say Wrote glm.txt."
    spec = real.spec(
        repo, objective, "zcode-glm", verification={"commands": ["grep -q glm glm.txt"]}
    )
    result = run_spec(cli, workdir, spec, real_env)
    assert result["status"] == "succeeded", result["error"]
    assert result["summary"] == "Wrote glm.txt."
    assert git(repo, "show", f"{result['branch']}:glm.txt") == "hello from glm"
    seen = model_server.api_requests("anthropic")
    assert seen and all(r.headers["authorization"] == f"Bearer {KEY}" for r in seen)
    assert "x-api-key" not in seen[0].headers
    assert {r.body["model"] for r in seen} == {"glm-4.6"}
    assert_key_nowhere(home)
    assert_only_model_route(cli, result["task_id"], real_env, model_server)


@only_claude_code
def test_a_claude_subscription_token_stays_on_the_host(
    cli, repo, workdir, home, real, real_env, model_server
):
    """The claude-subscription route: Claude Code inside holds a placeholder subscription token
    (so it speaks the subscription's protocol); the gateway adds the host's real one."""
    config = home / "config.yaml"
    config.write_text(
        config.read_text() + "worker_settings:\n  claude-code: {route: claude-subscription}\n"
    )
    objective = "Add a file.\n@write sub.txt: hello from a subscription\n@say Wrote sub.txt."
    result = run_spec(cli, workdir, real.spec(repo, objective), real_env)
    assert result["status"] == "succeeded", result["error"]
    seen = model_server.api_requests("anthropic")
    assert seen and all(r.headers["authorization"] == f"Bearer {KEY}" for r in seen)
    assert "x-api-key" not in seen[0].headers
    assert "oauth" in seen[0].headers.get("anthropic-beta", "")  # the subscription's protocol
    assert_key_nowhere(home)
    assert_only_model_route(cli, result["task_id"], real_env, model_server)
