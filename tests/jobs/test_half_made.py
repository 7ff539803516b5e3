"""A job's bad input refused before anything is made: per-task input that only a later task of
the job would carry (a fanout's second objective, a review's reviewer) is checked when the job
is asked for, so the refusal is one sentence and leaves no job row, no task and no worktree,
instead of a job that fails half-way with its first tasks made and running."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.repos import git

from bridge import WorkerBridge
from bridge.errors import InvalidSpec


def _nothing_made(bridge: WorkerBridge, repo: Path) -> None:
    assert bridge.store.jobs.list(None) == [], "no job row"
    assert bridge.list_tasks() == [], "no task"
    assert len(git(repo, "worktree", "list").splitlines()) == 1, "no worktree"
    assert "wb/" not in git(repo, "for-each-ref"), "no task branch"


def _spec(repo: Path, metadata: dict) -> dict:
    return {
        "objective": "unused",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "metadata": metadata,
    }


def test_a_fanouts_bad_input_for_a_later_objective_is_refused_before_anything_is_made(
    bridge: WorkerBridge, repo: Path, docker_images
):
    bad_second = {"candidates": [{"mock": {"write": {"a.txt": "1\n"}}}, {"mock": {"nope": 1}}]}
    with pytest.raises(InvalidSpec, match=r"^Unknown key 'metadata\.mock\.nope'"):
        bridge.fanout(_spec(repo, bad_second), ["part 1", "part 2"])
    _nothing_made(bridge, repo)
    too_many = {"candidates": [{}, {}, {}]}
    with pytest.raises(InvalidSpec, match="metadata.candidates has 3 entries for 2 objectives"):
        bridge.fanout(_spec(repo, too_many), ["part 1", "part 2"])
    _nothing_made(bridge, repo)


def test_a_reviews_bad_reviewer_input_is_refused_before_anything_is_made(
    bridge: WorkerBridge, repo: Path, docker_images
):
    for reviewer, words in (
        ({"mock": {"nope": 1}}, r"^Unknown key 'metadata\.mock\.nope'"),
        ([{"mock": {}}, {"mock": {"write": "x"}}], r"^metadata\.mock\.write must map paths"),
        ("approve", r"^metadata\.reviewer must be an object"),
        (["approve"], r"^metadata\.reviewer must be an object"),
    ):
        with pytest.raises(InvalidSpec, match=words):
            bridge.review(_spec(repo, {"reviewer": reviewer}), "mock", "mock", rounds=2)
        _nothing_made(bridge, repo)


@pytest.mark.parametrize("rounds", [True, "2", 2.0])
def test_a_reviews_rounds_that_are_not_a_whole_number_are_refused_before_anything_is_made(
    bridge: WorkerBridge, repo: Path, rounds
):
    # True passed `1 <= rounds <= most` as 1 and "2" failed with a TypeError, not a sentence.
    with pytest.raises(InvalidSpec, match=r"^--rounds must be between 1 and \d+"):
        bridge.review(_spec(repo, {}), "mock", "mock", rounds=rounds)
    _nothing_made(bridge, repo)
