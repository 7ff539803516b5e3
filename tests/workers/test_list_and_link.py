"""Workers: listing, linking a command-line agent, and running a linked worker for real."""

from __future__ import annotations

import json

from support.repos import git
from support.tasks import task_flags


def test_workers_list_json_has_the_contract_shape(cli, docker_images):
    result = cli("workers", "list", "--json")
    assert result.code == 0, result.stderr
    workers = {w["name"]: w for w in result.json()["workers"]}
    contract = {"name", "installed", "healthy", "image", "capabilities"}
    assert set(workers["mock"]) == contract | {"circuit"}  # its circuit breaker, issue 21
    assert workers["mock"]["circuit"]["state"] == "closed"
    assert workers["mock"]["installed"] is True
    assert workers["mock"]["image"].startswith("worker-bridge/mock:")


def test_a_linked_cli_runs_in_the_base_image_with_the_prompt_filled_in(cli, repo, docker_images):
    command = ["sh", "-c", 'printf "%s" "$1" > linked.txt; echo "final: done"', "sh", "{prompt}"]
    linked = cli("workers", "link", "echoer", "--command-json", json.dumps(command))
    assert linked.code == 0, linked.stderr
    listed = {w["name"]: w for w in cli("workers", "list", "--json").json()["workers"]}
    assert listed["echoer"]["image"].startswith("worker-bridge/base:")

    run = cli("tasks", "run", *task_flags(repo, "say hello", worker="echoer"), "--json")
    assert run.code == 0, run.stderr
    result = run.json()
    assert result["summary"] == "final: done"
    assert result["changed_files"] == [{"path": "linked.txt", "change": "added"}]
    worktree_file = f"{result['branch']}:linked.txt"
    prompt = git(repo, "show", worktree_file)
    assert prompt.startswith("say hello\n")  # the objective, then how to ask (issue 21)
    assert "worker-bridge-request" in prompt


def test_linking_with_a_command_that_is_not_a_json_list_is_a_usage_error(cli):
    result = cli("workers", "link", "bad", "--command-json", '"just a string"')
    assert result.code == 2
    assert "JSON list" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_builtin_worker_name_cannot_be_linked_over(cli):
    result = cli("workers", "link", "mock", "--command-json", '["x"]')
    assert result.code == 2
    assert "built-in" in result.stderr


def test_a_linked_worker_whose_route_has_no_key_is_installed_but_not_healthy(home, monkeypatch):
    from bridge import WorkerBridge
    from bridge.sandbox.fake import FakeSandbox

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    bridge.link_worker("claude-like", ["agent", "{prompt}"], routes=("anthropic",))
    [info] = [w for w in bridge.list_workers() if w.name == "claude-like"]
    assert info.installed is True and info.healthy is False
    assert "ANTHROPIC_API_KEY" in info.reason
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-present-key")
    [info] = [w for w in bridge.list_workers() if w.name == "claude-like"]
    assert info.healthy is True and info.reason is None
    bridge.close()


def test_a_built_in_cli_is_healthy_only_with_its_key_and_shows_its_version(
    cli, home, repo, docker_images
):
    from support.real_workers import ensure_worker_image

    ensure_worker_image(docker_images, "codex")
    (home / "config.yaml").write_text(
        "gateway:\n  routes:\n    openai: {key_env: WB_TEST_NO_SUCH_KEY}\n"
    )
    env = {"WB_TEST_NO_SUCH_KEY": ""}
    listed = {w["name"]: w for w in cli("workers", "list", "--json", env=env).json()["workers"]}
    codex = listed["codex"]
    assert codex["installed"] is True and codex["healthy"] is False
    assert codex["cli_version"] == "0.171.0"
    assert "WB_TEST_NO_SUCH_KEY" in codex["reason"]
    doctor = cli("doctor", "--json", env=env)
    warning = next(c for c in doctor.json()["checks"] if c["check"] == "worker:codex")
    assert warning["severity"] == "warning" and "WB_TEST_NO_SUCH_KEY" in warning["detail"]
    refused = cli(
        "tasks", "create", "--repo", str(repo), "--objective", "x", "--worker", "codex", env=env
    )
    assert refused.code == 2 and "WB_TEST_NO_SUCH_KEY" in refused.stderr
    keyed = {"WB_TEST_NO_SUCH_KEY": "sk-test"}
    listed = {w["name"]: w for w in cli("workers", "list", "--json", env=keyed).json()["workers"]}
    assert listed["codex"]["healthy"] is True and "reason" not in listed["codex"]
