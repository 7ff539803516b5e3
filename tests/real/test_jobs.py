"""Jobs with the real CLIs against the scripted model server (bridge/smoke/model_server.py,
whose plan is written in the objective): a compete between Claude Code and Codex ranked by our
verification and the tie-breaks, and a review with Codex implementing and Claude Code reviewing
read-only, its answer block the scripted model's final message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.jobs import wait_job
from support.real_workers import ensure_worker_image

from bridge import WorkerBridge

pytestmark = pytest.mark.usefixtures("docker_images")

CLIS = ("claude-code", "codex")


@pytest.fixture
def real_bridge(home: Path, real_env: dict[str, str], monkeypatch):
    """A bridge whose model routes lead to the scripted server; the route keys in this
    process's environment, which its detached coordinators and runners inherit."""
    from bridge.config.settings import load_config

    for var, value in real_env.items():
        monkeypatch.setenv(var, value)
    config = load_config({"WORKER_BRIDGE_HOME": str(home)})
    for name in CLIS:
        ensure_worker_image(config, name)
    instance = WorkerBridge(home=home)
    yield instance
    for job in instance.list_jobs():
        instance.cancel_job(job.job_id)
    instance.close()


def _spec(repo: Path, objective: str) -> dict:
    return {
        "objective": objective,
        "worker": "codex",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": ["grep -q 'hello from' hello.txt"]},
    }


def test_a_compete_between_two_clis_is_ranked_by_verification(real_bridge, repo, model_server):
    objective = "Add a greeting file.\n@write hello.txt: hello from a candidate\n@say Wrote it."
    job = real_bridge.compete(_spec(repo, objective), list(CLIS))
    done = wait_job(real_bridge, job.job_id, deadline_s=600)
    assert done.status == "succeeded", (done.error, done.candidates)
    assert sorted(c["worker"] for c in done.candidates) == sorted(CLIS)
    assert all(c["eligible"] and c["verification_ok"] for c in done.candidates)
    assert all(
        c["checks"]
        == [{"command": "grep -q 'hello from' hello.txt", "exit_code": 0, "passed": True}]
        for c in done.candidates
    )
    assert any(r.startswith("ranked above") for r in done.candidates[0]["reasons"])
    assert done.winner == done.candidates[0]["task_id"]
    assert real_bridge.accept_job(job.job_id).accepted
    assert (repo / "hello.txt").read_text().startswith("hello from a candidate")


def test_a_review_with_one_cli_implementing_and_another_reviewing(real_bridge, repo, model_server):
    answer = json.dumps({"verdict": "approve", "findings": []})
    objective = (
        "Add a greeting file.\n@write hello.txt: hello from codex\n"
        f"@say ```worker-bridge-review\\n{answer}\\n```"
    )
    job = real_bridge.review(_spec(repo, objective), "codex", "claude-code", rounds=2)
    done = wait_job(real_bridge, job.job_id, deadline_s=600)
    assert done.status == "succeeded", (done.error, done.rounds)
    assert done.stopped == "approved"
    (round_1,) = done.rounds
    assert round_1["verdict"] == "approve" and round_1["verification_ok"] is True
    review = real_bridge.get_task(round_1["reviewer_task"])
    assert review.worker == "claude-code" and review.changed_files == []
    assert [t.worker for t in done.tasks] == ["codex", "claude-code"]
