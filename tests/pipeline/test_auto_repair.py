"""Auto-repair: after failed verification the worker gets another turn (budget `auto_repair`
in config, `metadata.auto_repair` per task; 0 disables) with what failed, then the task is
collected and verified again."""

from __future__ import annotations

from support.tasks import task_events, task_flags

# Fails the check on its first turn and fixes it on the next.
WRONG_THEN_RIGHT = {"write": {"f.txt": "wrong\n"}, "on_follow_up": {"write": {"f.txt": "right\n"}}}


def _run(cli, repo, mock: dict, **metadata: object) -> dict:
    """A mock task whose check wants `right` in f.txt, through `tasks run`."""
    flags = task_flags(
        repo, "fix", verify=("grep -q right f.txt",), metadata={"mock": mock, **metadata}
    )
    return cli("tasks", "run", *flags, "--json").json()


def _kinds(cli, task_id: str) -> list[str]:
    return [e["kind"] for e in task_events(cli, task_id)]


def test_a_failed_verification_gets_a_repair_turn_that_can_fix_it(cli, repo, docker_images):
    result = _run(cli, repo, WRONG_THEN_RIGHT)
    assert result["status"] == "succeeded", result["error"]
    assert result["verification"]["ok"] is True
    kinds = _kinds(cli, result["task_id"])
    assert kinds.count("worker.started") == 2
    assert kinds.count("verification.auto_repair") == 1
    [repair] = task_events(cli, result["task_id"], kind="verification.auto_repair")
    assert repair["data"]["command"] == "grep -q right f.txt"


def test_the_repair_budget_is_spent_and_then_the_task_fails(cli, repo, docker_images):
    mock = {"write": {"f.txt": "wrong\n"}, "on_follow_up": {"write": {"g.txt": "x"}}}
    result = _run(cli, repo, mock, auto_repair=2)
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "verification_failed"
    assert _kinds(cli, result["task_id"]).count("verification.auto_repair") == 2
    assert {c["path"] for c in result["changed_files"]} == {"f.txt", "g.txt"}


def test_auto_repair_zero_disables_it(cli, repo, docker_images):
    result = _run(cli, repo, WRONG_THEN_RIGHT, auto_repair=0)
    assert result["status"] == "failed"
    assert "verification.auto_repair" not in _kinds(cli, result["task_id"])
