"""A worker that asks, through the real engine with the mock worker: a name its proxy refused
becomes a pending request (approved while it runs, or after its turn ended, which resumes it),
a question or a path request in its final message leaves the task `waiting_input`, and the
answer (given by another process, the CLI) reaches it in its next turn. A denial and the input
timeout end the task as it would have ended without asking; what is not asked in the exact
shape, in the final message, is ignored."""

from __future__ import annotations

import json

import pytest
from support.asking import FENCE, block, net_config, reach
from support.repos import commit_all, git
from support.tasks import (
    mock_task,
    run_spec,
    show_task,
    start_spec,
    task_events,
    wait_for_event,
    wait_until_done,
)
from support.waiting import poll

from bridge.ui.views import requests_of

pytestmark = pytest.mark.usefixtures("docker_images", "no_task_outlives_the_test")

# A conftest.py a worker writes to make every test pass on broken code.
PASS_EVERYTHING = "def pytest_runtest_call(item):\n    item.runtest = lambda: None\n"


@pytest.fixture
def net(home, upstream):
    """config.yaml: the proxy may reach the test upstream's port on the host's loopback."""
    (home / "config.yaml").write_text(net_config(upstream.port))
    return {}


def ask_network(**network) -> dict:
    return {"mode": "allowlist", "domains": ["localhost"], "on_refused": "ask", **network}


def answer(cli, task_id: str, request_id: str, *how: str, env=None):
    return cli("tasks", "answer", task_id, request_id, *how, "--json", env=env)


def pending(result: dict) -> list[dict]:
    return [r for r in result["requests"] if r["status"] == "pending"]


def wait_status(cli, task_id: str, status: str, env=None, deadline_s: float = 90) -> dict:
    return poll(
        lambda: (r := show_task(cli, task_id, env))["status"] == status and r,
        f"task {task_id} to be {status}",
        deadline_s,
    )


# -- network -----------------------------------------------------------------------------------


def test_a_name_approved_from_another_process_while_the_worker_runs_lets_its_next_try_through(
    cli, repo, workdir, net, upstream
):
    spec = mock_task(repo, {"script": reach(upstream.port, tries=300)}, network=ask_network())
    task_id = start_spec(cli, workdir, spec, net)  # a detached runner hosts the gateway
    raised = wait_for_event(cli, task_id, "task.request", net)["data"]
    assert raised["kind"] == "network"
    assert raised["detail"] == {"host": "vm", "port": upstream.port}
    # The CLI, another process, answers through the store.
    done = answer(cli, task_id, raised["request_id"], "--approve", env=net)
    assert done.code == 0, done.stderr
    result = wait_until_done(cli, task_id, net)
    assert result["status"] == "succeeded", result["error"]
    assert git(repo, "show", f"{result['branch']}:probe.txt").startswith("reached: ")
    assert "/asked" in git(repo, "show", f"{result['branch']}:probe.txt")
    [request] = result["requests"]
    assert request["status"] == "approved" and request["attempts"] >= 1
    assert result["allowlist"] == ["localhost", f"vm:{upstream.port}"]  # that port alone
    shown = cli("tasks", "show", task_id, env=net).stdout
    assert f"allowlist: localhost, vm:{upstream.port}" in shown and "approved" in shown
    kinds = [e["kind"] for e in task_events(cli, task_id, net)]
    assert "task.answer" in kinds and "waiting_input" not in json.dumps(
        [e for e in task_events(cli, task_id, net, "task.status")]
    )


def test_a_live_approval_the_worker_used_does_not_turn_a_later_denial_into_a_resume(
    cli, repo, workdir, net, upstream
):
    question = {"kind": "question", "text": "Ship it now?"}
    mock = {
        "script": reach(upstream.port, tries=300),
        "summary": "Reached it.\n" + block(question),
        "on_follow_up": {"write": {"resumed.txt": "a turn nobody asked for\n"}},
    }
    task_id = start_spec(cli, workdir, mock_task(repo, mock, network=ask_network()), net)
    raised = wait_for_event(cli, task_id, "task.request", net)["data"]
    assert answer(cli, task_id, raised["request_id"], "--approve", env=net).code == 0
    waiting = wait_status(cli, task_id, "waiting_input", net)
    [asked] = pending(waiting)
    assert asked["kind"] == "question"
    done = answer(cli, task_id, asked["request_id"], "--deny", env=net)
    assert done.code == 0, done.stderr
    ended = wait_until_done(cli, task_id, net)
    assert ended["status"] == "succeeded", ended["error"]  # the held outcome, no resume
    assert [e["data"]["turn"] for e in task_events(cli, task_id, net, "worker.started")] == [0]
    assert git(repo, "show", f"{ended['branch']}:probe.txt").startswith("reached: ")


def test_a_name_left_pending_at_the_turns_end_waits_and_an_approval_resumes_the_worker(
    cli, repo, workdir, net, upstream
):
    mock = {
        "script": reach(upstream.port, tries=1),
        "on_follow_up": {
            "script": "cp /bridge/prompt.txt prompt-seen.txt && " + reach(upstream.port, tries=1)
        },
    }
    result = run_spec(cli, workdir, mock_task(repo, mock, network=ask_network()), net)
    task_id = result["task_id"]
    assert result["status"] == "waiting_input", result
    [request] = pending(result)
    assert request["kind"] == "network" and request["detail"]["host"] == "vm"
    # Waiting is no crash: recovery leaves it alone, prune keeps its worktree.
    assert cli("tasks", "recover", env=net).code == 0
    assert show_task(cli, task_id, net)["status"] == "waiting_input"
    pruned = cli("workspaces", "prune", "--json", "--include-unaccepted", env=net)
    assert task_id not in pruned.stdout
    listed = cli("tasks", "list", env=net).stdout
    assert "1 ask" in next(line for line in listed.splitlines() if task_id in line)

    done = answer(cli, task_id, request["request_id"], "--approve", env=net)
    assert done.code == 0, done.stderr
    assert done.json()["status"] in ("queued", "running")
    result = wait_until_done(cli, task_id, net)
    assert result["status"] == "succeeded", result["error"]
    branch = result["branch"]
    assert git(repo, "show", f"{branch}:probe.txt").startswith("reached: ")
    told = git(repo, "show", f"{branch}:prompt-seen.txt")
    assert f"network access to vm:{upstream.port}: approved" in told
    started = task_events(cli, task_id, net, "worker.started")
    assert [e["data"]["turn"] for e in started] == [0, 1]
    again = answer(cli, task_id, request["request_id"], "--deny", env=net)
    assert again.code == 1 and "already approved" in again.stderr


def test_a_denial_and_the_input_timeout_each_end_the_task_as_without_the_request(
    cli, repo, workdir, net, upstream
):
    mock = {
        "write": {"out.txt": "made\n"},
        "script": reach(upstream.port, tries=1),
        "on_follow_up": {"write": {"out.txt": "a turn nobody asked for\n"}},
    }
    spec = mock_task(repo, mock, verify=["grep -q made out.txt"], network=ask_network())
    denied = run_spec(cli, workdir, spec, net)
    assert denied["status"] == "waiting_input"
    assert denied["verification"]["ok"] is True  # what it left was verified already
    [request] = pending(denied)
    done = answer(cli, denied["task_id"], request["request_id"], "--deny", env=net)
    assert done.code == 0, done.stderr
    ended = show_task(cli, denied["task_id"], net)
    assert ended["status"] == "succeeded" and ended["verification"]["ok"] is True
    assert ended["requests"][0]["status"] == "denied" and ended["allowlist"] == ["localhost"]
    assert git(repo, "show", f"{ended['branch']}:out.txt") == "made\n"
    assert [
        e["data"]["turn"] for e in task_events(cli, ended["task_id"], net, "worker.started")
    ] == [0]

    spec["limits"] = {"input_timeout_seconds": 1}
    timed = run_spec(cli, workdir, spec, net)
    assert timed["status"] == "waiting_input"
    # Nothing runs a waiting task: the next command that acts (here `tasks recover`) expires it.
    ended = poll(
        lambda: (
            cli("tasks", "recover", env=net)
            and (r := show_task(cli, timed["task_id"], net))["status"] != "waiting_input"
            and r
        ),
        "the request to expire",
        30,
    )
    assert ended["status"] == "succeeded" and ended["requests"][0]["status"] == "expired"
    late = answer(cli, timed["task_id"], ended["requests"][0]["request_id"], "--approve", env=net)
    assert late.code == 1 and "already expired" in late.stderr


def test_a_refused_address_class_never_becomes_a_request(cli, repo, workdir, home, upstream):
    # Without trusting loopback, `vm` (127.0.0.1 here) is a loopback address: refused outright.
    (home / "config.yaml").write_text(f"gateway:\n  connect_ports: [{upstream.port}]\n")
    script = reach(upstream.port, host="vm") + "\n" + reach(upstream.port, "10.0.0.1", out="b")
    result = run_spec(cli, workdir, mock_task(repo, {"script": script}, network=ask_network()))
    assert result["status"] == "succeeded", result["error"]
    assert result["requests"] == []
    assert "loopback" in git(repo, "show", f"{result['branch']}:probe.txt")
    refused = task_events(cli, result["task_id"], None, "network.refused")
    assert {r["data"]["host"] for r in refused} == {"vm", "10.0.0.1"}
    assert task_events(cli, result["task_id"], None, "task.request") == []


def test_a_worker_asking_for_many_names_raises_only_as_many_requests_as_config_allows(
    cli, repo, workdir, home, upstream
):
    (home / "config.yaml").write_text(
        "gateway:\n  trusted_ranges: ['127.0.0.0/8']\n  max_requests: 1\n"
        f"  connect_ports: [{upstream.port}]\n"
    )
    script = reach(upstream.port, "vm") + "\n" + reach(upstream.port, "runsc", out="b")
    result = run_spec(cli, workdir, mock_task(repo, {"script": script}, network=ask_network()))
    assert result["status"] == "waiting_input"
    assert [r["detail"]["host"] for r in result["requests"]] == ["vm"]
    assert "refused" in git(repo, "show", f"{result['branch']}:b")
    cancelled = cli("tasks", "cancel", result["task_id"], "--json")
    assert cancelled.code == 0 and cancelled.json()["status"] == "cancelled"
    assert [r["status"] for r in cancelled.json()["requests"]] == ["denied"]  # nothing waits


# -- questions and paths -----------------------------------------------------------------------


def test_a_question_waits_and_its_answer_reaches_the_worker_in_its_next_turn(
    cli, repo, workdir, home
):
    question = {"kind": "question", "text": "Which database?", "choices": ["sqlite", "redis"]}
    mock = {
        "write": {"notes.txt": "first\n"},
        "summary": "I need to know one thing.\n\n" + block(question),
        "on_follow_up": {"script": "cp /bridge/prompt.txt prompt-seen.txt"},
    }
    result = run_spec(cli, workdir, mock_task(repo, mock))
    assert result["status"] == "waiting_input", result
    [request] = pending(result)
    assert request["kind"] == "question" and request["detail"] == {
        "text": "Which database?",
        "choices": ["sqlite", "redis"],
    }
    shown = cli("tasks", "show", result["task_id"]).stdout
    assert "Which database? [sqlite | redis]" in shown and "tasks answer" in shown
    rid = request["request_id"]
    for bad, words in (
        (("--approve",), "is a question"),
        (("--approve", "--text", "x"), "exactly one"),
        (("--text", ""), "1 to 4000"),
    ):
        refused = answer(cli, result["task_id"], rid, *bad)
        assert refused.code == 2 and words in refused.stderr, refused.stderr
    unknown = answer(cli, result["task_id"], "r-nope", "--text", "sqlite")
    assert unknown.code == 2 and "has no request 'r-nope'" in unknown.stderr
    assert show_task(cli, result["task_id"])["status"] == "waiting_input"  # nothing changed

    done = answer(cli, result["task_id"], rid, "--text", "sqlite")
    assert done.code == 0, done.stderr
    ended = wait_until_done(cli, result["task_id"])
    assert ended["status"] == "succeeded", ended["error"]
    assert ended["requests"][0]["status"] == "answered"
    told = git(repo, "show", f"{ended['branch']}:prompt-seen.txt")
    assert 'your question "Which database?": answered: sqlite' in told
    assert git(repo, "show", f"{ended['branch']}:notes.txt") == "first\n"  # kept its turn


def test_a_block_at_the_end_of_a_long_final_message_is_read_whole(cli, repo, workdir):
    # The summary shown is cut at output_tail_chars (4000); the block after it still counts.
    question = {"kind": "question", "text": "Keep the old API?", "choices": ["yes", "no"]}
    summary = "Here is what I did.\n" + "details " * 1500 + "\n" + block(question)
    assert len(summary) > 12_000
    result = run_spec(cli, workdir, mock_task(repo, {"summary": summary}))
    assert result["status"] == "waiting_input", result
    [request] = pending(result)
    assert request["detail"] == {"text": "Keep the old API?", "choices": ["yes", "no"]}
    assert len(result["summary"]) <= 4000  # only the display is cut
    assert cli("tasks", "cancel", result["task_id"]).code == 0


def test_a_block_not_in_the_exact_shape_or_not_in_the_final_message_is_ignored(cli, repo, workdir):
    question = {"kind": "question", "text": "Which?"}
    emitted = json.dumps({"type": "result", "summary": "early\n" + block(question)})
    cases = {
        "two blocks": block(question) + "\n" + block(question),
        "unknown key": block({**question, "status": "approved"}),
        "self-approval": block({"kind": "paths", "paths": ["a"], "reason": "r", "ok": True}),
        "wrong type": block({"kind": "question", "text": ["Which?"]}),
        "escaping path": block({"kind": "paths", "paths": ["../x"], "reason": "r"}),
        "oversized": block({"kind": "question", "text": "x" * 5000}),
        "not json": f"{FENCE}worker-bridge-request\n{{kind: question}}\n{FENCE}",
    }
    for name, summary in cases.items():
        spec = mock_task(repo, {"summary": summary}, verification={"protected_paths": ["a"]})
        result = run_spec(cli, workdir, spec)
        assert result["status"] == "succeeded" and result["requests"] == [], name
    # A block in an earlier message (here a result line the script printed) is not the final.
    spec = mock_task(repo, {"script": f"echo '{emitted}'", "summary": "All done."})
    result = run_spec(cli, workdir, spec)
    assert result["status"] == "succeeded" and result["requests"] == []
    assert result["summary"] == "All done."


def test_an_approved_path_request_lets_exactly_those_protected_paths_change(
    cli, repo, workdir, home
):
    (repo / "checks").mkdir()
    (repo / "checks" / "t.py").write_text("old\n")
    (repo / "locked").mkdir()
    (repo / "locked" / "l.txt").write_text("old\n")
    commit_all(repo, "protected files")
    ask = {"kind": "paths", "paths": ["checks/**"], "reason": "the test is wrong"}
    protected = {"protected_paths": ["checks/**", "locked/**"], "commands": ["true"]}

    def task(follow: dict) -> dict:
        mock = {"summary": "Need the tests.\n" + block(ask), "on_follow_up": follow}
        result = run_spec(cli, workdir, mock_task(repo, mock, verification=protected))
        assert result["status"] == "waiting_input", result
        [request] = pending(result)
        assert request["detail"] == {
            "paths": ["checks/**"],
            "reason": "the test is wrong",
            # the protected files of the base it matches (the worker added none)
            "covers": {"checks/**": {"base": 1, "added": 0, "paths": ["checks/t.py"]}},
        }
        text = answer(cli, result["task_id"], request["request_id"], "--text", "yes")
        assert text.code == 2 and "approve or deny, not a text" in text.stderr
        done = answer(cli, result["task_id"], request["request_id"], "--approve")
        assert done.code == 0, done.stderr
        return wait_until_done(cli, result["task_id"])

    allowed = task({"write": {"checks/t.py": "new\n"}})
    assert allowed["status"] == "succeeded", allowed["error"]
    assert allowed["approved_paths"] == ["checks/**"]

    beyond = task({"write": {"checks/t.py": "new\n", "locked/l.txt": "new\n"}})
    assert beyond["status"] == "failed"
    assert beyond["error"]["kind"] == "protected_path"
    assert "locked/l.txt" in beyond["error"]["message"]

    # Accept checks again, from the store: with the approval gone, the change is refused.
    from bridge.store import Store

    store = Store(home / "bridge.db")
    store.conn.execute(
        "UPDATE requests SET status = 'denied' WHERE task_id = ?", (allowed["task_id"],)
    )
    store.close()
    refused = cli("tasks", "accept", allowed["task_id"], "--json")
    assert refused.code == 1 and refused.json()["kind"] == "protected_path"
    assert (repo / "checks" / "t.py").read_text() == "old\n"


def test_a_wide_glob_shows_how_many_protected_files_it_covers(cli, repo, workdir):
    for i in range(3):
        (repo / "checks").mkdir(exist_ok=True)
        (repo / "checks" / f"t{i}.py").write_text("old\n")
    (repo / "locked").mkdir()
    (repo / "locked" / "l.txt").write_text("old\n")
    commit_all(repo, "protected files")
    ask = {"kind": "paths", "paths": ["*", "checks/t0.py"], "reason": "small fix, honest"}
    protected = {"protected_paths": ["checks/**", "locked/**"], "commands": ["true"]}
    mock = {"summary": block(ask)}
    result = run_spec(cli, workdir, mock_task(repo, mock, verification=protected))
    assert result["status"] == "waiting_input", result
    [request] = pending(result)
    covered = request["detail"]["covers"]
    assert {glob: c["base"] for glob, c in covered.items()} == {"*": 4, "checks/t0.py": 1}
    assert covered["*"]["paths"] == ["checks/t0.py", "checks/t1.py", "checks/t2.py", "locked/l.txt"]
    shown = cli("tasks", "show", result["task_id"]).stdout
    assert "* (4 protected file(s) in the base: checks/t0.py, checks/t1.py," in shown  # all
    assert "checks/t0.py (1 protected file(s) in the base: checks/t0.py)" in shown
    assert cli("tasks", "cancel", result["task_id"]).code == 0


def test_a_path_request_covers_the_protected_files_the_worker_added_and_names_them(
    cli, repo, workdir, bridge
):
    """`conf*` matches no protected file of the base, yet approving it excuses the conftest.py
    the worker already wrote (one that makes every test pass on broken code): what the request
    covers is counted in the worker's snapshot too, and the approver is shown the paths."""
    ask = {"kind": "paths", "paths": ["conf*", "tests/**"], "reason": "tidy the test setup"}
    protected = {"protected_paths": ["conftest.py", "tests/**"], "commands": ["true"]}
    mock = {"write": {"conftest.py": PASS_EVERYTHING}, "summary": block(ask)}
    result = run_spec(cli, workdir, mock_task(repo, mock, verification=protected))
    assert result["status"] == "waiting_input", result
    [request] = pending(result)
    assert request["detail"]["covers"] == {
        "conf*": {"base": 0, "added": 1, "paths": ["conftest.py"]},
        "tests/**": {"base": 1, "added": 0, "paths": ["tests/test_calc.py"]},
    }
    shown = cli("tasks", "show", result["task_id"]).stdout
    assert "conf* (0 protected file(s) in the base, 1 the worker added: conftest.py)" in shown
    assert "tests/** (1 protected file(s) in the base: tests/test_calc.py)" in shown
    # The web view shows the same words (MCP's worker_status is the result shown above).
    [on_page] = requests_of(bridge.get_task(result["task_id"]))
    assert "1 the worker added: conftest.py" in on_page["what"]
    assert cli("tasks", "cancel", result["task_id"]).code == 0


def test_what_a_path_request_covers_names_a_bounded_number_of_paths(cli, repo, workdir):
    files = {f"tests/t{n:02}.py": "x = 1\n" for n in range(30)}
    ask = {"kind": "paths", "paths": ["tests/**"], "reason": "many"}
    protected = {"protected_paths": ["tests/**"], "commands": ["true"]}
    mock = {"write": files, "summary": block(ask)}
    result = run_spec(cli, workdir, mock_task(repo, mock, verification=protected))
    [request] = pending(result)
    covered = request["detail"]["covers"]["tests/**"]
    assert (covered["base"], covered["added"]) == (1, 30)
    assert covered["paths"] == [f"tests/t{n:02}.py" for n in range(10)], "the added first"
    shown = cli("tasks", "show", result["task_id"]).stdout
    assert "tests/t09.py and 21 more)" in shown
    assert cli("tasks", "cancel", result["task_id"]).code == 0


def test_a_question_and_its_answer_are_redacted_where_shown_but_reach_the_worker_whole(
    cli, repo, workdir
):
    question = {"kind": "question", "text": "Use password=Sup3rS3cretValue9 for the db?"}
    mock = {
        "summary": block(question),
        "on_follow_up": {"script": "cp /bridge/prompt.txt prompt-seen.txt"},
    }
    result = run_spec(cli, workdir, mock_task(repo, mock))
    assert result["status"] == "waiting_input"
    [request] = pending(result)
    done = answer(
        cli, result["task_id"], request["request_id"], "--text", "no: password=An0therS3cret7"
    )
    assert done.code == 0, done.stderr
    ended = wait_until_done(cli, result["task_id"])
    assert ended["status"] == "succeeded", ended["error"]
    shown = json.dumps(ended) + json.dumps(task_events(cli, result["task_id"]))
    shown += cli("tasks", "show", result["task_id"]).stdout
    assert "Sup3rS3cretValue9" not in shown and "An0therS3cret7" not in shown
    # What is executed is never redacted: the worker got the answer as given.
    assert "password=An0therS3cret7" in git(repo, "show", f"{ended['branch']}:prompt-seen.txt")
