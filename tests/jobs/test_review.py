"""Review jobs through the real engine with the mock worker: `changes_requested` becomes a
follow-up turn in the implementer's own task (its session and worktree) verified again, then
another review; `approve` ends the job; the round limit holds and so does the stop on a round
with no new findings; a reviewer's write attempt changes nothing; accept takes the reviewed
change; and bad input (a reviewer with no read-only mode, rounds out of bounds) is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.jobs import wait_job
from support.repos import git

from bridge import WorkerBridge
from bridge.errors import InvalidSpec

VERIFY = ["python3 -c 'import calc'"]


def _verdict(verdict: str, *findings: str) -> dict:
    body = {
        "verdict": verdict,
        "findings": [
            {"path": "calc.py", "line": n + 1, "severity": "major", "text": text}
            for n, text in enumerate(findings)
        ],
    }
    return {"mock": {"summary": f"Reviewed.\n```worker-bridge-review\n{json.dumps(body)}\n```"}}


def _spec(repo: Path, reviewer: list[dict] | dict, **mock) -> dict:
    implementer = {
        "write": {"calc.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b): return a-b\n"},
        "on_follow_up": {
            "write": {
                "calc.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"
                "    return a - b\n"
            }
        },
        **mock,
    }
    return {
        "objective": "Add sub() to calc.py",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": VERIFY},
        "metadata": {"mock": implementer, "reviewer": reviewer},
    }


def test_changes_requested_leads_to_a_follow_up_verified_again_then_approve_ends_it(
    bridge: WorkerBridge, repo: Path, docker_images
):
    reviewer = [
        _verdict("changes_requested", "put sub's body on its own line"),
        _verdict("approve"),
    ]
    job = bridge.review(_spec(repo, reviewer), "mock", "mock", rounds=3)
    done = wait_job(bridge, job.job_id)
    assert done.status == "succeeded", (done.error, done.rounds)
    assert done.stopped == "approved"
    assert [r["verdict"] for r in done.rounds] == ["changes_requested", "approve"]
    assert done.rounds[0]["findings"][0]["text"] == "put sub's body on its own line"
    assert [r["implementer_turn"] for r in done.rounds] == [0, 1]
    assert all(r["verification_ok"] is True for r in done.rounds)
    roles = [t.role for t in done.tasks]
    assert roles == ["implementer", "reviewer", "reviewer"], "one implementer task throughout"
    impl = done.tasks[0].task_id
    events = bridge.store.events(impl)
    follow = [e for e in events if e.kind == "task.follow_up"]
    assert len(follow) == 1 and "put sub's body on its own line" in follow[0].data["message"]
    assert sum(e.kind == "verification.completed" for e in events) == 2, "verified again"
    for reviewer_task in done.tasks[1:]:
        assert bridge.store.load_task(reviewer_task.task_id).spec.permission == "read_only"
    second = bridge.store.load_task(done.rounds[1]["reviewer_task"])
    assert second.base_commit == bridge.store.load_task(impl).snapshot_commit, "the new snapshot"
    kinds = [e.kind for e in bridge.store.events(job.job_id)]
    assert kinds.count("job.round") == 2
    outcome = bridge.accept_job(job.job_id)
    assert outcome.accepted, outcome.reason
    assert "    return a - b\n" in (repo / "calc.py").read_text()


def test_the_round_limit_holds(bridge: WorkerBridge, repo: Path, docker_images):
    reviewer = [_verdict("changes_requested", f"finding {n}") for n in range(5)]
    done = wait_job(bridge, bridge.review(_spec(repo, reviewer), "mock", "mock", rounds=2).job_id)
    assert done.status == "succeeded" and done.stopped == "round limit"
    assert len(done.rounds) == 2
    assert [t.role for t in done.tasks].count("reviewer") == 2


def test_a_round_with_no_new_findings_stops_the_review(bridge, repo, docker_images):
    same = _verdict("changes_requested", "the same complaint")
    done = wait_job(bridge, bridge.review(_spec(repo, same), "mock", "mock", rounds=5).job_id)
    assert done.stopped == "no new findings"
    assert [r["new_findings"] for r in done.rounds] == [1, 0]


def test_a_reviewers_write_attempt_is_refused_and_changes_nothing(bridge, repo, docker_images):
    hostile = _verdict("approve")
    hostile["mock"]["script"] = "echo pwned > calc.py; echo pwned > new.txt; true"
    done = wait_job(bridge, bridge.review(_spec(repo, hostile), "mock", "mock").job_id)
    assert done.status == "succeeded", done.rounds
    review = bridge.get_task(done.rounds[0]["reviewer_task"])
    assert review.changed_files == [], "the read-only mount refused the writes"
    impl = bridge.store.load_task(done.tasks[0].task_id)
    shown = git(repo, "show", f"{impl.snapshot_commit}:calc.py")
    assert "pwned" not in shown and "def sub" in shown
    assert git(repo, "status", "--porcelain") == ""


def test_a_reviewers_invalid_answer_fails_the_job_with_the_round_shown(bridge, repo, docker_images):
    garbled = {"mock": {"summary": '```worker-bridge-review\n{"verdict": "lgtm"}\n```'}}
    done = wait_job(bridge, bridge.review(_spec(repo, garbled), "mock", "mock").job_id)
    assert done.status == "failed"
    assert "verdict is not one of" in done.rounds[0]["problem"]


def test_bad_review_input_gets_one_sentence_each(bridge, repo, docker_images):
    spec = _spec(repo, _verdict("approve"))
    with pytest.raises(InvalidSpec, match="--rounds must be between 1 and 10"):
        bridge.review(spec, "mock", "mock", rounds=0)
    with pytest.raises(InvalidSpec, match="Unknown worker 'nosuch'"):
        bridge.review(spec, "mock", "nosuch")
    bridge.link_worker("plain", ["plain-agent", "{prompt}"])
    with pytest.raises(InvalidSpec, match="no read-only mode"):
        bridge.review(spec, "mock", "plain")
