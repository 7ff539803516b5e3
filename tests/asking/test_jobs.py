"""A job whose candidate asks: its coordinator waits for that task as for a running one (the
job stays running), the caller answers it through the library (`WorkerBridge.answer`), the
candidate resumes and the job ranks both candidates; an unanswered one expires and the job
still ends."""

from __future__ import annotations

import pytest
from support.asking import block
from support.jobs import compete_task, wait_job
from support.waiting import poll

from bridge.errors import InvalidSpec, TaskStateError

pytestmark = pytest.mark.usefixtures("docker_images", "no_task_outlives_the_test")

QUESTION = {"kind": "question", "text": "One line or two?", "choices": ["one", "two"]}


def _asking(**extra) -> dict:
    return {
        "summary": "A question first.\n" + block(QUESTION),
        "on_follow_up": {"write": {"notes.txt": "one\n"}},
        **extra,
    }


def test_a_candidate_waiting_for_input_holds_the_job_until_it_is_answered(bridge, repo):
    spec = compete_task(
        repo, [_asking(), {"write": {"notes.txt": "plain\n"}}], verify=["test -f notes.txt"]
    )
    job = bridge.compete(spec, ["mock"], attempts=2)
    asking = poll(
        lambda: next(
            (
                t
                for t in bridge.job_status(job.job_id).tasks
                if bridge.get_task(t.task_id).status == "waiting_input"
            ),
            None,
        ),
        "a candidate to wait for input",
        120,
    )
    assert bridge.job_status(job.job_id).status == "running"
    waiting = bridge.get_task(asking.task_id)
    [request] = waiting.requests
    with pytest.raises(InvalidSpec, match="exactly one"):
        bridge.answer(asking.task_id, request["request_id"])
    resumed = bridge.answer(asking.task_id, request["request_id"], text="one")
    # Resumed by this answer, or by the candidate's runner looking once more as it ended its
    # turn (whichever reserved the next turn first queues it): moving on either way.
    assert resumed.status in ("waiting_input", "queued", "running", "succeeded")
    poll(lambda: bridge.task_status(asking.task_id) != "waiting_input", "the resume", 60)
    with pytest.raises(TaskStateError, match="already answered"):
        bridge.answer(asking.task_id, request["request_id"], decision="deny")
    done = wait_job(bridge, job.job_id)
    assert done.status == "succeeded", done.error
    assert all(c["eligible"] for c in done.candidates), done.candidates


def test_an_unanswered_candidate_expires_and_the_job_still_ends(bridge, repo):
    plain = {"write": {"notes.txt": "plain\n"}}
    spec = compete_task(repo, [_asking(), plain], verify=["test -f notes.txt"])
    spec["limits"] = {"input_timeout_seconds": 1}
    job = bridge.compete(spec, ["mock"], attempts=2)
    done = wait_job(bridge, job.job_id)  # its coordinator expires the request
    assert done.status == "succeeded", done.error
    ended = [bridge.get_task(t.task_id) for t in done.tasks]
    asked = next(t for t in ended if t.requests)
    # It ends as without asking: its turn left no notes.txt, so its verification failed.
    assert asked.status == "failed" and asked.requests[0]["status"] == "expired"
    assert asked.error.kind == "verification_failed"
    assert [c["eligible"] for c in done.candidates].count(True) == 1
