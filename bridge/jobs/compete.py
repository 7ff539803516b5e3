"""A compete job: one objective on N candidates (each its own task and worktree from the same
base commit), ranked by our own verification and the deterministic tie-breaks (ranking.py),
then, when a judge is named, by the judge's ranking of the eligible ones, asked twice with the
labels in reversed presentation order. A judge that fails, answers an invalid ranking or
disagrees with itself leaves the job `unresolved`, with both orderings for the caller. A
candidate (or the judge) whose worker's circuit breaker refuses its task is skipped, with an
event and the breaker's sentence in the result's `skipped`."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from bridge.documents import JobFindings, JudgeAsking, RankedCandidate, Skipped, Verdict
from bridge.errors import CircuitOpen
from bridge.jobs.coordinator import JobCoordinator
from bridge.jobs.figures import candidate_of
from bridge.jobs.judge import assign_labels, judge_prompt, parse_ranking
from bridge.jobs.ranking import rank
from bridge.jobs.slots import candidate_label, candidate_spec, judge_spec
from bridge.models import JobStatus, Status
from bridge.workspace.readable import readable_text


def run_compete(co: JobCoordinator) -> None:
    job = co.job()
    task_ids = []
    skipped: list[Skipped] = []
    for n in range(len(job.spec["workers"])):
        co.alive()
        spec = candidate_spec(job.spec, job.job_id, n)
        label = candidate_label(n)
        try:
            task_ids.append(co.ensure_task(spec, "candidate", label))
        except CircuitOpen as refused:  # its breaker opened since the job was made
            skipped.append(co.skip(label, spec["worker"], "candidate", refused))
    result = JobFindings(skipped=skipped)
    if not task_ids:
        message = "Every candidate was refused by its worker's circuit breaker: "
        co.finish(
            JobStatus.FAILED,
            result,
            {"kind": "circuit_open", "message": message + skipped[0]["reason"]},
        )
        return
    for task_id in task_ids:
        co.start(task_id)
    records = co.wait_all(task_ids)
    artifacts = co.store.artifacts_of(task_ids)
    diffs = {t: artifacts.get(t, {}).get("diff") for t in task_ids}
    ranked = rank([candidate_of(r, diffs[r.task_id]) for r in records])
    readable = {t: shown_diff(artifacts.get(t, {})) for t in task_ids}
    eligible = [c["task_id"] for c in ranked if c["eligible"]]
    result["candidates"] = ranked
    result["ordering"] = {"deterministic": eligible}
    co.store.add_event(job.job_id, "job.ranked", {"by": "verification", "ordering": eligible})
    if not eligible:
        co.finish(
            JobStatus.FAILED,
            result,
            {
                "kind": "verification_failed",
                "message": "No candidate passed our verification without breaking a protected "
                "path or policy; see each candidate's reasons.",
            },
        )
        return
    if job.spec.get("judge") and len(eligible) >= 2:
        verdict = ask_judge(co, eligible, readable)
        result["judge"] = verdict
        result["ordering"]["judge"] = verdict["ordering"]
        co.store.add_event(job.job_id, "job.ranked", {"by": "judge", **verdict})
        if verdict["ordering"] is None:
            co.finish(JobStatus.UNRESOLVED, result)
            return
        _add_judge_reasons(ranked, verdict)
        result["winner"] = verdict["ordering"][0]
    else:
        result["winner"] = eligible[0]
    co.finish(JobStatus.SUCCEEDED, result)


def shown_diff(artifacts: dict[str, str]) -> str | None:
    """The diff a judge or reviewer reads: the readable one (a file git shows as binary given
    as its text, escaped), or, for a task collected before there was one, the diff itself."""
    return artifacts.get("readable") or artifacts.get("diff")


def read_diff(path: str | None, bound: int) -> tuple[str, int]:
    """The first part of a diff file (enough for ``bound`` characters, what is not text
    escaped) and its whole size."""
    if not path or not Path(path).is_file():
        return "", 0
    with open(path, "rb") as diff:
        return readable_text(diff.read(4 * (bound + 1)))[: bound + 1], Path(path).stat().st_size


def ask_judge(co: JobCoordinator, eligible: list[str], diffs: dict[str, str | None]) -> Verdict:
    """Ask the judge twice (labels in order, then reversed); the orderings by task id, each
    asking's answer or problem, and ``ordering``: the agreed one, or None."""
    job = co.job()
    labels = assign_labels(job.job_id, eligible)
    bounds = job.config.jobs
    texts = {
        label: read_diff(diffs[task_id], bounds.quoted_diff_chars)
        for label, task_id in labels.items()
    }
    shown = {label: text for label, (text, _) in texts.items()}
    totals = {label: total for label, (_, total) in texts.items()}
    order = sorted(labels)
    askings = []
    for n, presented in enumerate((order, order[::-1])):
        objective = judge_prompt(job.spec["task"]["objective"], shown, presented, totals, bounds)
        spec = judge_spec(job.spec, job.job_id, n + 1, objective)
        try:
            askings.append(co.ensure_task(spec, "judge", f"judge-{n + 1}"))
        except CircuitOpen as refused:  # the judge's breaker opened: the caller chooses
            skip = co.skip(f"judge-{n + 1}", spec["worker"], "judge", refused)
            problem = f"the judge was not asked: {skip['reason']}"
            return Verdict(labels=labels, askings=[], ordering=None, problem=problem)
    for task_id in askings:
        co.start(task_id)
    answers: list[JudgeAsking] = []
    for record in co.wait_all(askings):
        reasons: dict[str, str]
        if record.status != Status.SUCCEEDED:
            why = record.error.message if record.error else f"it ended {record.status}"
            ranking, reasons, problem = None, {}, f"the judge's task did not succeed: {why}"
        else:
            ranking, reasons, problem = parse_ranking(record.summary, order, list(shown.values()))
        answers.append(
            JudgeAsking(
                task_id=record.task_id,
                ranking=[labels[x] for x in ranking] if ranking else None,
                reasons={labels[k]: v for k, v in reasons.items()},
                problem=problem or None,
            )
        )
    agreed = agreement(answers)
    return Verdict(
        labels=labels, askings=answers, ordering=agreed["ordering"], problem=agreed["problem"]
    )


class Agreement(TypedDict):
    ordering: list[str] | None
    problem: str | None


def agreement(answers: list[JudgeAsking]) -> Agreement:
    """``ordering``: the judge's ordering when every asking gave a valid one and all agree,
    else None with the ``problem`` (an asking's, or their disagreement)."""
    rankings = [a["ranking"] for a in answers]
    first = rankings[0] if rankings else None
    if first is not None and all(r == first for r in rankings):
        return Agreement(ordering=first, problem=None)
    return Agreement(ordering=None, problem=_disagreement(answers))


def _disagreement(answers: list[JudgeAsking]) -> str:
    problems = [a["problem"] for a in answers if a["problem"]]
    if problems:
        return "; ".join(problems)
    return "the judge ranked the candidates differently when shown them in reverse order"


def _add_judge_reasons(ranked: list[RankedCandidate], verdict: Verdict) -> None:
    place = {task_id: n + 1 for n, task_id in enumerate(verdict["ordering"] or [])}
    reasons = verdict["askings"][0]["reasons"]
    for candidate in ranked:
        task_id = candidate["task_id"]
        if task_id in place:
            candidate["judge_rank"] = place[task_id]
            candidate["reasons"].append(
                f"judge placed it {place[task_id]}: {reasons.get(task_id, 'no reason given')}"
            )
