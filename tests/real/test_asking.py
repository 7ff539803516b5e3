"""Asking with real worker CLIs against the scripted model server: the CLI's final message ends
with a question block, the task waits, and the answer resumes the CLI's own session: the model
sees the first turn's messages and the answer, and acts on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.real_workers import ensure_worker_image
from support.repos import git
from support.tasks import run_spec, show_task, task_events, wait_until_done

pytestmark = pytest.mark.usefixtures("docker_images", "no_task_outlives_the_test")

# (worker, the scripted server's API it speaks)
CLIS = [("claude-code", "anthropic"), ("codex", "responses")]


@pytest.fixture(params=CLIS, ids=lambda cli: cli[0])
def real(request, home: Path, real_env: dict[str, str]) -> tuple[str, str]:
    from bridge.config.settings import load_config

    ensure_worker_image(load_config({"WORKER_BRIDGE_HOME": str(home)}), request.param[0])
    return request.param


def test_a_question_waits_and_the_answer_resumes_the_clis_own_session(
    cli, repo, workdir, real, real_env, model_server
):
    worker, api_name = real
    question = json.dumps({"kind": "question", "text": "Which database?", "choices": ["sqlite"]})
    objective = (
        "Set up the cache.\n"
        "@write notes.txt: started\n"
        f"@say I need one answer.\\n```worker-bridge-request\\n{question}\\n```"
    )
    spec = {
        "objective": objective,
        "worker": worker,
        "workspace": {"repository": str(repo)},
        "verification": {"commands": ["grep -q sqlite db.txt"]},
    }
    result = run_spec(cli, workdir, spec, real_env)
    task_id = result["task_id"]
    assert result["status"] == "waiting_input", result
    [request] = result["requests"]
    assert request["kind"] == "question" and request["detail"]["text"] == "Which database?"
    assert result["verification"]["ok"] is False  # what it left so far fails the check
    session = result["session_id"]
    assert session
    first = len(model_server.api_requests(api_name))

    text = "sqlite\n@follow-write db.txt: sqlite\n@say Used sqlite."
    done = cli("tasks", "answer", task_id, request["request_id"], "--text", text, env=real_env)
    assert done.code == 0, done.stderr
    ended = wait_until_done(cli, task_id, real_env, deadline_s=240)
    assert ended["status"] == "succeeded", ended["error"]
    assert ended["session_id"] == session
    assert ended["verification"]["ok"] is True
    assert git(repo, "show", f"{ended['branch']}:notes.txt").strip() == "started"
    assert git(repo, "show", f"{ended['branch']}:db.txt").strip() == "sqlite"
    assert ended["requests"][0]["status"] == "answered"

    from bridge.smoke.apis import API_ROUTES

    api = next(a for a in API_ROUTES if a.name == api_name)
    later = model_server.api_requests(api_name)[first:]
    texts = api.conversation(later[0].body or {}).user_texts
    assert "Set up the cache." in texts[0]  # the first turn, in the same session
    assert "answered: sqlite" in texts[-1] and "Which database?" in texts[-1]
    started = task_events(cli, task_id, real_env, "worker.started")
    assert [e["data"]["turn"] for e in started] == [0, 1]
    assert show_task(cli, task_id, real_env)["summary"] == "Used sqlite.."
