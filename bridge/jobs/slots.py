"""A job's slots: the task spec each of its tasks starts from, derived from the job's own spec
alone, so a coordinator resumed in another process derives exactly the same ones.

Per-candidate input (what the mock worker does, say) rides in the task's metadata:
`metadata.candidates[i]` is merged over the metadata of candidate i, and `metadata.judge`
is the judge's metadata (one object, or a list with one per asking, the last repeating);
neither key reaches any task. Every task of a job carries the
idempotency key `<job id>:<label>`, so creating a slot's task twice finds the first.
"""

from __future__ import annotations

import copy
import shlex

from bridge.documents import JobSpec
from bridge.errors import InvalidSpec
from bridge.models import JsonObject

JOB_KEYS = ("candidates", "judge")


# The metadata the judge or a reviewer gets: one object for every asking (round), or a list with
# one per asking, the last repeating.
PerTurn = JsonObject | list[JsonObject] | None


def split_metadata(metadata: JsonObject) -> tuple[JsonObject, list[JsonObject], PerTurn]:
    """(the metadata every task shares, the per-candidate overrides, the judge's metadata),
    checked: one sentence naming what is wrong."""
    shared = {k: v for k, v in metadata.items() if k not in JOB_KEYS}
    candidates = metadata.get("candidates", [])
    if not isinstance(candidates, list) or not all(isinstance(c, dict) for c in candidates):
        raise InvalidSpec("metadata.candidates must be a list of objects, one per candidate.")
    judge = metadata.get("judge")
    if judge is not None and not (
        isinstance(judge, dict)
        or (isinstance(judge, list) and all(isinstance(j, dict) for j in judge))
    ):
        raise InvalidSpec(
            "metadata.judge must be an object (the judge task's metadata) or a list of them, "
            "one per asking."
        )
    return shared, candidates, judge


def per_turn(given: PerTurn, number: int) -> JsonObject:
    """One object for every turn (asking, round), or a list with one per turn (1-based
    ``number``), the last one repeating."""
    if isinstance(given, list):
        return dict(given[min(number, len(given)) - 1]) if given else {}
    return dict(given or {})


def idempotency_key(job_id: str, label: str) -> str:
    return f"{job_id}:{label}"


def candidate_label(n: int) -> str:
    return f"c{n + 1}"


def candidate_spec(job_spec: JobSpec, job_id: str, n: int) -> JsonObject:
    """The task spec of candidate ``n`` (0-based) of a compete."""
    task = copy.deepcopy(job_spec["task"])
    shared, overrides, _ = split_metadata(task.get("metadata") or {})
    metadata = {**shared, **(overrides[n] if n < len(overrides) else {})}
    task.update(
        worker=job_spec["workers"][n],
        metadata=metadata,
        idempotency_key=idempotency_key(job_id, candidate_label(n)),
    )
    return task


def judge_spec(job_spec: JobSpec, job_id: str, asking: int, objective: str) -> JsonObject:
    """The task spec of asking ``asking`` (1-based) of the judge: read-only, on the same base,
    no checks."""
    task = job_spec["task"]
    _, _, judge_metadata = split_metadata(task.get("metadata") or {})
    label = f"judge-{asking}"
    spec: JsonObject = {
        "objective": objective,
        "worker": job_spec["judge"],
        "workspace": dict(task["workspace"]),
        "permission": "read_only",
        "metadata": per_turn(judge_metadata, asking),
        "idempotency_key": idempotency_key(job_id, label),
    }
    for key in ("limits", "network", "priority"):
        if key in task:
            spec[key] = copy.deepcopy(task[key])
    return spec


def implementer_spec(job_spec: JobSpec, job_id: str) -> JsonObject:
    """The implementer's task of a review job (the task spec without the reviewer's input)."""
    task = copy.deepcopy(job_spec["task"])
    metadata = {k: v for k, v in (task.get("metadata") or {}).items() if k != "reviewer"}
    task.update(
        worker=job_spec["worker"],
        metadata=metadata,
        idempotency_key=idempotency_key(job_id, "implementer"),
    )
    return task


def reviewer_metadata(metadata: JsonObject, round_no: int) -> JsonObject:
    """`metadata.reviewer`: the reviewer's metadata, one object for every round or a list of
    them, one per round (the last one repeating)."""
    return per_turn(metadata.get("reviewer"), round_no)


def reviewer_spec(
    job_spec: JobSpec, job_id: str, round_no: int, snapshot: str, objective: str
) -> JsonObject:
    """Round ``round_no``'s reviewer: read-only, on the implementer's verified snapshot."""
    task = job_spec["task"]
    spec: JsonObject = {
        "objective": objective,
        "worker": job_spec["reviewer"],
        "workspace": {"repository": task["workspace"]["repository"], "base_ref": snapshot},
        "permission": "read_only",
        "metadata": reviewer_metadata(task.get("metadata") or {}, round_no),
        "idempotency_key": idempotency_key(job_id, f"review-{round_no}"),
    }
    for key in ("limits", "network", "priority"):
        if key in task:
            spec[key] = copy.deepcopy(task[key])
    return spec


def fanout_spec(job_spec: JobSpec, job_id: str, n: int) -> JsonObject:
    """The task of objective ``n`` (0-based) of a fanout: the shared spec, its own objective
    (and `metadata.candidates[n]` merged over its metadata, as for a compete)."""
    task = copy.deepcopy(job_spec["task"])
    shared, overrides, _ = split_metadata(task.get("metadata") or {})
    task.update(
        objective=job_spec["objectives"][n],
        metadata={**shared, **(overrides[n] if n < len(overrides) else {})},
        idempotency_key=idempotency_key(job_id, f"o{n + 1}"),
    )
    return task


def mode_script(modes: dict[str, str]) -> str:
    """The shell command that gives each written file its mode as the merge has it (the mock
    writes contents only), failing when a file is missing."""
    by_mode: dict[str, list[str]] = {}
    for path, mode in sorted(modes.items()):
        by_mode.setdefault(mode, []).append(shlex.quote(path))
    return " && ".join(f"chmod {mode} -- {' '.join(paths)}" for mode, paths in by_mode.items())


def integration_spec(
    job_spec: JobSpec,
    job_id: str,
    n: int,
    write: dict[str, str],
    delete: list[str],
    modes: dict[str, str] | None = None,
) -> JsonObject:
    """Step ``n`` (1-based) of an integration: a task from the common base whose deterministic
    `mock` worker writes the merged files of the first n tasks (contents, then ``modes``), then
    is verified."""
    first = job_spec["task"]
    ids = ", ".join(job_spec["tasks"][:n])
    spec: JsonObject = {
        "objective": f"Integrate {ids} (step {n} of {len(job_spec['tasks'])})",
        "worker": "mock",
        "workspace": {"repository": job_spec["repository"], "base_ref": job_spec["base_commit"]},
        "verification": copy.deepcopy(first.get("verification") or {}),
        "metadata": {"mock": {"write": write, "delete": delete}},
        "idempotency_key": idempotency_key(job_id, f"step-{n}"),
    }
    if modes:
        spec["metadata"]["mock"]["script"] = mode_script(modes)
    for key in ("limits", "environment", "priority"):
        if first.get(key) is not None:
            spec[key] = copy.deepcopy(first[key])
    return spec
