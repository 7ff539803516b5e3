"""Auto-repair: after failed verification the worker gets another turn (budget `auto_repair`
in config, `metadata.auto_repair` per task; 0 disables) with what failed, then the task is
collected and verified again."""

from __future__ import annotations

import json


def _run(cli, repo, mock: dict, *extra: str) -> dict:
    result = cli(
        "tasks",
        "run",
        "--repo",
        str(repo),
        "--worker",
        "mock",
        "--objective",
        "fix",
        "--verify",
        "grep -q right f.txt",
        "--metadata-json",
        json.dumps(mock),
        *extra,
        "--json",
    )
    return result.json()


def _kinds(cli, task_id: str) -> list[str]:
    return [e["kind"] for e in cli("tasks", "logs", task_id, "--json").json()["events"]]


def test_a_failed_verification_gets_a_repair_turn_that_can_fix_it(cli, repo, docker_images):
    mock = {
        "mock": {"write": {"f.txt": "wrong\n"}, "on_follow_up": {"write": {"f.txt": "right\n"}}}
    }
    result = _run(cli, repo, mock)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    kinds = _kinds(cli, result["task_id"])
    assert kinds.count("worker.started") == 2
    assert kinds.count("verification.auto_repair") == 1
    repair = [
        e
        for e in cli("tasks", "logs", result["task_id"], "--json").json()["events"]
        if e["kind"] == "verification.auto_repair"
    ][0]
    assert repair["data"]["command"] == "grep -q right f.txt"


def test_the_repair_budget_is_spent_and_then_the_task_fails(cli, repo, docker_images):
    mock = {
        "mock": {"write": {"f.txt": "wrong\n"}, "on_follow_up": {"write": {"g.txt": "x"}}},
        "auto_repair": 2,
    }
    result = _run(cli, repo, mock)
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "verification_failed"
    assert _kinds(cli, result["task_id"]).count("verification.auto_repair") == 2
    assert {c["path"] for c in result["changed_files"]} == {"f.txt", "g.txt"}


def test_auto_repair_zero_disables_it(cli, repo, docker_images):
    mock = {
        "mock": {"write": {"f.txt": "wrong\n"}, "on_follow_up": {"write": {"f.txt": "right\n"}}},
        "auto_repair": 0,
    }
    result = _run(cli, repo, mock)
    assert result["status"] == "failed"
    assert "verification.auto_repair" not in _kinds(cli, result["task_id"])
