"""The reads that start at once (bridge/reads.py) answer exactly what the facade does, on every
kind of task: succeeded, failed verification, a worker that failed, cancelled, renamed and
deleted files, secrets in the objective and in requests, approved requests, a typed task; and
they step aside (None) whenever they cannot tell cheaply, so the facade answers instead."""

from __future__ import annotations

import json
import time

import pytest
from support.repos import git
from support.tasks import mock_task

from bridge import WorkerBridge, reads
from bridge.sandbox.fake import FakeSandbox

SECRET = "sk-" + "Ab1_" * 6


@pytest.fixture
def default_env(home, monkeypatch):
    """The store where it is by default, under HOME."""
    for name in ("WORKER_BRIDGE_STORE", "WORKER_BRIDGE_REPOSITORIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORKER_BRIDGE_HOME", str(home))
    return home


@pytest.fixture
def bridge(default_env):
    instance = WorkerBridge(home=default_env, sandbox=FakeSandbox())
    yield instance
    instance.close()


def run(bridge: WorkerBridge, spec: dict) -> str:
    task_id = bridge.create_task(spec).task_id
    bridge.run_task(task_id)
    return task_id


def add_requests(bridge: WorkerBridge, task_id: str) -> None:
    """Requests of every kind and status, as rows (the gateway's and the runner's writes)."""
    rows = [
        ("network", {"host": "pypi.org", "port": 443}, "approved", {"decision": "approve"}, 3),
        ("network", {"host": "evil.example", "port": 80}, "denied", {"decision": "deny"}, 1),
        ("paths", {"paths": ["tests/**"], "reason": "stale"}, "approved", None, 1),
        ("question", {"text": f"use {SECRET}?"}, "answered", {"text": f"yes {SECRET}"}, 1),
        ("question", {"text": "which?", "choices": ["a", "b"]}, "pending", None, 1),
    ]
    now = "2026-12-02T00:00:00.000Z"
    with bridge.store.transaction() as conn:
        for n, (kind, detail, status, answer, attempts) in enumerate(rows):
            conn.execute(
                "INSERT INTO requests (request_id, task_id, kind, key, detail, status, at,"
                " updated_at, attempts, turn, expires_at, answer) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    f"r{n}-{task_id}",
                    task_id,
                    kind,
                    f"k{n}",
                    json.dumps(detail),
                    status,
                    now,
                    now,
                    attempts,
                    0,
                    time.time() + 60,
                    json.dumps(answer) if answer else None,
                ),
            )


@pytest.fixture
def many_tasks(bridge, repo) -> list[str]:
    git(repo, "mv", "calc.py", "calc2.py")
    git(repo, "commit", "-qm", "rename")
    ids = [
        run(bridge, mock_task(repo, {"write": {"a.txt": "1\n"}}, verify=["true", "echo out"])),
        run(bridge, mock_task(repo, {"write": {"b.txt": "2\n"}}, verify=["false"])),
        run(bridge, mock_task(repo, {"exit_code": 3, "summary": "it broke"})),
        run(
            bridge,
            mock_task(
                repo,
                {"write": {"n.txt": "x\n"}, "delete": ["calc2.py"]},
                objective=f"use the key {SECRET} please",
                network={"mode": "allowlist", "domains": ["Example.COM."]},
            ),
        ),
        bridge.create_task(mock_task(repo, {"write": {"c.txt": "3\n"}})).task_id,
    ]
    bridge.cancel_task(ids[-1])
    add_requests(bridge, ids[3])
    typed = mock_task(repo, {"write": {"d.txt": "4\n"}})
    typed.setdefault("metadata", {})["type"] = "hotfix"
    ids.append(run(bridge, typed))
    return ids


def test_a_task_shows_the_same_both_ways(bridge, many_tasks):
    for task_id in many_tasks:
        quick = reads.show_task(task_id)
        assert quick == bridge.get_task(task_id).document(), task_id
        # the same document, byte for byte, once printed as JSON
        assert json.dumps(quick) == json.dumps(bridge.get_task(task_id).document())
    shown = reads.show_task(many_tasks[3])
    assert SECRET not in json.dumps(shown)
    assert {r["status"] for r in shown["requests"]} >= {"approved", "denied", "pending"}
    assert "pypi.org:443" in shown["allowlist"] and "example.com" in shown["allowlist"]
    assert shown["approved_paths"] == ["tests/**"]
    statuses = {reads.show_task(t)["status"] for t in many_tasks}
    assert statuses >= {"succeeded", "failed", "cancelled"}


def test_a_listing_is_the_same_both_ways(bridge, many_tasks):
    assert reads.list_tasks() == [t.document() for t in bridge.list_tasks()]
    assert reads.list_tasks(limit=2) == [t.document() for t in bridge.list_tasks(limit=2)]
    failed = [t.document() for t in bridge.list_tasks(status="failed")]
    assert failed and reads.list_tasks(status="failed") == failed


def test_the_reads_step_aside_when_they_cannot_tell(bridge, many_tasks, default_env, monkeypatch):
    task_id = many_tasks[0]
    assert reads.show_task("no-such-task") is None  # the facade names the unknown id
    assert reads.list_tasks(status="bogus") is None  # ... and the unknown status
    monkeypatch.setenv("WORKER_BRIDGE_MAX_CONCURRENCY", "2")  # a setting reads do not use
    monkeypatch.setenv("WORKER_BRIDGE_LIMITS__MEMORY_MB", "512")
    assert reads.show_task(task_id) == bridge.get_task(task_id).document()
    for name, value in (
        ("WORKER_BRIDGE_MAX_CONCURENCY", "2"),  # misspelt: load_config names it
        ("WORKER_BRIDGE_STORE", str(default_env / "other.db")),
        ("WORKER_BRIDGE_REPOSITORIES", '["/elsewhere"]'),
    ):
        monkeypatch.setenv(name, value)
        assert reads.show_task(task_id) is None and reads.list_tasks() is None, name
        monkeypatch.delenv(name)
    (default_env / "config.yaml").write_text("repositories: [/elsewhere]\n")
    assert reads.show_task(task_id) is None and reads.list_tasks() is None
    (default_env / "config.yaml").unlink()
    assert reads.show_task(task_id) is not None
    with bridge.store.transaction() as conn:  # a store a migration short: Store migrates it
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0011_pool'")
    assert reads.show_task(task_id) is None
    monkeypatch.setenv("WORKER_BRIDGE_HOME", str(default_env / "none-here"))
    assert reads.list_tasks() is None  # no store yet
    (default_env / "none-here").mkdir()
    (default_env / "none-here" / "bridge.db").write_bytes(b"not a database, " * 100)
    assert reads.list_tasks() is None  # not a store at all: the Store says so


def test_the_cli_answers_the_same_when_the_reads_step_aside(bridge, many_tasks, default_env, cli):
    task_id = many_tasks[3]
    quick = cli("tasks", "show", task_id, "--json")
    assert quick.code == 0 and quick.json() == bridge.get_task(task_id).document()
    (default_env / "config.yaml").write_text(
        f"repositories: [{bridge.get_task(task_id).repository}]\n"
    )
    full = cli("tasks", "show", task_id, "--json")
    assert full.code == 0 and full.json() == quick.json()
    (default_env / "config.yaml").write_text("repositories: [/elsewhere]\n")
    hidden = cli("tasks", "show", task_id)
    assert hidden.code != 0 and "No task" in hidden.stderr
    assert cli("tasks", "list", "--json").json() == {"tasks": []}


def test_a_state_root_whose_name_holds_uri_characters_is_read_as_itself(workdir, repo, monkeypatch):
    """SQLite's URI of the store is percent-encoded: a `?` or `#` in a folder's name neither cuts
    the path short (another file, opened read-write) nor drops the read-only mode."""
    home = workdir / "h?mode=rwc#x%41"
    home.mkdir()
    monkeypatch.setenv("WORKER_BRIDGE_HOME", str(home))
    for name in ("WORKER_BRIDGE_STORE", "WORKER_BRIDGE_REPOSITORIES"):
        monkeypatch.delenv(name, raising=False)
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    try:
        task_id = run(bridge, mock_task(repo, {"write": {"a.txt": "1\n"}}))
        before = sorted(p.name for p in workdir.iterdir())
        assert reads.show_task(task_id) == bridge.get_task(task_id).document()
        assert sorted(p.name for p in workdir.iterdir()) == before  # no stray file made
    finally:
        bridge.close()


def test_a_hostile_workers_task_reads_the_same_and_shows_nothing_raw(bridge, repo, cli):
    """What a worker controls (its summary, file names that are not UTF-8 or hold escapes, its
    checks' output, a request block in a file rather than its final message) comes out of the
    fast read exactly as out of the facade: redacted, and never raw on a terminal."""
    script = (
        "printf x > \"$(printf 'bad\\377name\\033[2J.txt')\"; "
        'printf \'```worker-bridge-request\\n{"kind": "question", "text": "forged"}\\n```\\n\''
        " > notes.md; echo " + SECRET
    )
    mock = {"script": script, "summary": f"done \x1b]0;owned\x07 with {SECRET}"}
    spec = mock_task(repo, mock, verify=[f"echo {SECRET}; printf '\\033[31mred'"])
    spec["objective"] = f"keep {SECRET} secret"
    task_id = run(bridge, spec)
    quick = reads.show_task(task_id)
    assert quick == bridge.get_task(task_id).document()
    assert quick["status"] == "succeeded" and "done" in quick["summary"], quick
    assert SECRET not in json.dumps(quick)
    assert quick["requests"] == []  # a block in a file is no request
    assert any("name" in c["path"] for c in quick["changed_files"]), quick["changed_files"]
    shown = cli("tasks", "show", task_id)
    assert shown.code == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout and SECRET not in shown.stdout
    listed = cli("tasks", "list")
    assert "\x1b" not in listed.stdout and SECRET not in listed.stdout
