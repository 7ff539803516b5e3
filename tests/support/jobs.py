"""Jobs as the tests drive them: a compete's task spec with one mock script per candidate, a
judge's mock answer, and waiting for a job to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.waiting import poll

JOB_ENDED = {"succeeded", "unresolved", "failed", "cancelled", "accepted"}


def compete_task(
    repo: Path,
    candidates: list[dict],
    *,
    verify: list[str] | None = None,
    protected: list[str] | None = None,
    judge: dict | list[dict] | None = None,
    objective: str = "Make the calculator subtract",
) -> dict[str, Any]:
    """The task spec of a compete: CANDIDATES[i] is candidate i's metadata.mock, JUDGE (a
    metadata.mock, or a list of them, one per asking) the judge's."""
    metadata: dict[str, Any] = {"candidates": [{"mock": c} for c in candidates]}
    if judge is not None:
        metadata["judge"] = (
            [{"mock": j} for j in judge] if isinstance(judge, list) else {"mock": judge}
        )
    return {
        "objective": objective,
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": verify or [], "protected_paths": protected or []},
        "metadata": metadata,
    }


def judge_answer(ranking: list[str], reasons: dict | None = None) -> dict:
    """A mock judge whose final message is this ranking block."""
    body = json.dumps({"ranking": ranking, "reasons": reasons or {k: "ok" for k in ranking}})
    return {"summary": f"Ranked.\n\n```worker-bridge-ranking\n{body}\n```"}


def wait_job(bridge, job_id: str, deadline_s: float = 180) -> Any:
    """The job result once the job has ended."""
    return poll(
        lambda: (r := bridge.job_status(job_id)).status in JOB_ENDED and r,
        f"job {job_id} to end",
        deadline_s,
    )
