"""Jobs through the front ends: the CLI's `jobs compete --wait` with a line per candidate's
progress, `jobs show|list|accept|cancel` and `tasks retry`, each with its JSON and its one
sentence on bad input; and a real MCP SDK session that runs a compete to a ranked result and
accepts it, with tool errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.jobs import compete_task
from support.mcp_session import call, call_error, mcp_server
from support.repos import git
from support.tasks import task_flags, wait_until_done
from support.waiting import poll

pytestmark = pytest.mark.anyio

VERIFY = ("test ! -e broken.txt",)


def _candidates() -> dict:
    spec = compete_task(
        Path("/unused"),
        [
            {"write": {"a.txt": "one\ntwo\n"}},
            {"write": {"a.txt": "one\n"}},
            {"write": {"broken.txt": "x"}},
        ],
    )
    return spec["metadata"]


def test_the_cli_runs_a_compete_to_the_end_and_accepts_its_winner(cli, repo, docker_images):
    flags = task_flags(repo, "write a.txt", verify=VERIFY, metadata=_candidates())
    run = cli("jobs", "compete", "--workers", "mock,mock,mock", "--wait", *flags, timeout=300)
    assert run.code == 0, run.stderr
    assert "#1" in run.stdout and "<- winner" in run.stdout
    assert "ineligible: our verification failed" in run.stdout
    assert "candidate c3" in run.stderr and "succeeded" in run.stderr, "live progress per candidate"
    assert "  c2: worker mock started" in run.stderr
    assert "  c3: check `test ! -e broken.txt`: failed" in run.stderr
    job_id = run.stdout.split()[1]
    shown = cli("jobs", "show", job_id, "--json")
    assert shown.code == 0, shown.stderr
    job = shown.json()
    assert job["status"] == "succeeded"
    assert [c["label"] for c in job["candidates"]] == ["c2", "c1", "c3"]
    assert job["winner"] == job["candidates"][0]["task_id"]
    listed = cli("jobs", "list", "--json").json()
    assert [j["job_id"] for j in listed["jobs"]] == [job_id]
    refused = cli("jobs", "accept", job_id, "--task", job["candidates"][2]["task_id"])
    assert refused.code == 1 and "not eligible" in refused.stderr
    accepted = cli("jobs", "accept", job_id, "--json")
    assert accepted.code == 0, accepted.stderr
    assert accepted.json()["applied"] == ["a.txt"]
    assert (repo / "a.txt").read_text() == "one\n"
    assert cli("jobs", "show", job_id, "--json").json()["status"] == "accepted"


def test_the_cli_refuses_bad_job_input_with_one_sentence(cli, repo):
    flags = task_flags(repo, "x")
    one = cli("jobs", "compete", "--workers", "mock", *flags)
    assert one.code == 2 and "at least two candidates" in one.stderr
    assert len(one.stderr.strip().splitlines()) == 1
    unknown = cli("jobs", "show", "job-nosuch")
    assert unknown.code == 2 and "No job 'job-nosuch'" in unknown.stderr
    assert cli("jobs", "cancel", "job-nosuch").code == 2


def test_cancel_through_the_cli_stops_every_task_of_the_job(cli, repo, docker_images):
    metadata = {"candidates": [{"mock": {"sleep": 300}}] * 2}
    flags = task_flags(repo, "sleep", metadata=metadata)
    job_id = cli("jobs", "compete", "--workers", "mock", "--attempts", "2", *flags).stdout.strip()
    poll(lambda: len(cli("jobs", "show", job_id, "--json").json()["tasks"]) == 2, "two tasks")
    cancelled = cli("jobs", "cancel", job_id, "--json")
    assert cancelled.code == 0, cancelled.stderr
    tasks = cancelled.json()["tasks"]
    assert [t["status"] for t in tasks] == ["cancelled", "cancelled"]


def test_retry_makes_a_new_task_from_the_same_spec_linked_to_the_first(cli, repo, docker_images):
    flags = task_flags(repo, "write b", verify=("true",), metadata={"mock": {"write": {"b": "1"}}})
    first = cli("tasks", "run", *flags, "--json").json()
    retried = cli("tasks", "retry", first["task_id"], "--json")
    assert retried.code == 0, retried.stderr
    second = wait_until_done(cli, retried.json()["task_id"])
    assert second["task_id"] != first["task_id"] and second["status"] == "succeeded"
    assert second["objective"] == first["objective"]
    logs = cli("tasks", "logs", first["task_id"], "--json").json()["events"]
    assert {"task_id": second["task_id"]} in [
        e["data"] for e in logs if e["kind"] == "task.retried"
    ]


async def test_an_mcp_session_runs_a_compete_to_a_ranked_result_and_accepts_it(
    home: Path, repo: Path, docker_images
):
    async with mcp_server(home) as client:
        job = await call(
            client,
            "worker_compete",
            {
                "objective": "write a.txt",
                "repository": str(repo),
                "workers": ["mock", "mock"],
                "verify": list(VERIFY),
                "metadata": {
                    "candidates": [
                        {"mock": {"write": {"a.txt": "one\ntwo\nthree\n"}}},
                        {"mock": {"write": {"a.txt": "short\n"}}},
                    ]
                },
                "wait": True,
            },
        )
        assert job["status"] == "succeeded", json.dumps(job)[:2000]
        assert [c["label"] for c in job["candidates"]] == ["c2", "c1"]
        status = await call(client, "worker_job_status", {"job_id": job["job_id"]})
        assert status["winner"] == job["winner"]
        accepted = await call(client, "worker_job_accept", {"job_id": job["job_id"]})
        assert accepted["accepted"] and accepted["applied"] == ["a.txt"]
        assert (repo / "a.txt").read_text() == "short\n"
        said = await call_error(client, "worker_job_accept", {"job_id": job["job_id"]})
        assert "already accepted" in said
        missing = await call_error(client, "worker_job_status", {"job_id": "job-nosuch"})
        assert "No job 'job-nosuch'" in missing
        few = await call_error(
            client,
            "worker_compete",
            {"objective": "x", "repository": str(repo), "workers": ["mock"], "verify": []},
        )
        assert "at least two candidates" in few
        cancelled = await call(client, "worker_job_cancel", {"job_id": job["job_id"]})
        assert cancelled["status"] == "accepted", "an ended job is left as it is"
    assert git(repo, "status", "--porcelain").strip() == "?? a.txt"


def test_the_cli_runs_a_review_with_its_rounds_shown(cli, repo, docker_images):
    review = {"verdict": "approve", "findings": []}
    metadata = {
        "mock": {"write": {"b.txt": "b\n"}},
        "reviewer": {"mock": {"summary": f"```worker-bridge-review\n{json.dumps(review)}\n```"}},
    }
    flags = task_flags(repo, "write b", verify=("true",), metadata=metadata)
    run = cli("jobs", "review", "--reviewer", "mock", "--wait", *flags, timeout=300)
    assert run.code == 0, run.stderr
    assert "round 1: turn 0, verification passed, review approve" in run.stdout
    assert "stopped: approved" in run.stdout
    job_id = run.stdout.split()[1]
    shown = cli("jobs", "show", job_id, "--json").json()
    assert shown["kind"] == "review" and shown["rounds"][0]["verdict"] == "approve"
    no_reviewer = cli("jobs", "review", *flags)
    assert no_reviewer.code == 2 and "--reviewer" in no_reviewer.stderr


def test_the_cli_fans_out_then_integrates_and_accepts(cli, repo, docker_images):
    metadata = {
        "candidates": [{"mock": {"write": {"x.txt": "x\n"}}}, {"mock": {"write": {"y.txt": "y\n"}}}]
    }
    flags = task_flags(repo, "unused", verify=("true",), metadata=metadata)
    flags[flags.index("--objective") + 1] = "write x"
    run = cli("jobs", "fanout", *flags, "--objective", "write y", "--wait", "--json", timeout=300)
    assert run.code == 0, run.stderr
    fan = run.json()
    assert fan["kind"] == "fanout" and [t["label"] for t in fan["tasks"]] == ["o1", "o2"]
    ids = ",".join(t["task_id"] for t in fan["tasks"])
    merged = cli("jobs", "integrate", fan["job_id"], "--tasks", ids, "--wait", timeout=300)
    assert merged.code == 0, merged.stderr
    assert "step 2: task" in merged.stdout
    job_id = merged.stdout.split()[1]
    assert cli("jobs", "accept", job_id).code == 0
    assert (repo / "x.txt").read_text() == "x\n" and (repo / "y.txt").read_text() == "y\n"
    refused = cli("jobs", "accept", fan["job_id"])
    assert refused.code == 1 and "is a fanout" in refused.stderr


async def test_the_mcp_job_tools_treat_a_job_outside_the_scope_as_absent(
    home: Path, workdir: Path, repo: Path, docker_images
):
    from bridge import WorkerBridge

    unscoped = WorkerBridge(home=home)
    spec = compete_task(repo, [{"sleep": 60}] * 2)
    job = unscoped.compete(spec, ["mock"], attempts=2)
    allowed = workdir / "allowed"
    allowed.mkdir()
    (home / "config.yaml").write_text(f"repositories:\n  - {allowed}\n")
    try:
        async with mcp_server(home) as client:
            for tool in ("worker_job_status", "worker_job_accept", "worker_job_cancel"):
                unknown = await call_error(client, tool, {"job_id": "job-0000000000"})
                said = await call_error(client, tool, {"job_id": job.job_id})
                assert said == unknown.replace("job-0000000000", job.job_id), tool
                assert "No job" in said
        assert unscoped.job_status(job.job_id).status in ("created", "running"), "left alone"
    finally:
        unscoped.cancel_job(job.job_id)
        unscoped.close()
