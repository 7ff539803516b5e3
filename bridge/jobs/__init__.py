"""Jobs: several tasks advanced together by one coordinator (compete: one objective on several
candidates, ranked by our own verification and optionally a judge). The facade
(bridge/service.py) is the front ends' only door here; see docs/jobs.md."""

from bridge.jobs.creation import new_compete_row
from bridge.jobs.detached import recover_jobs, spawn_coordinator
from bridge.jobs.results import chosen_candidate, job_result

__all__ = [
    "chosen_candidate",
    "job_result",
    "new_compete_row",
    "recover_jobs",
    "spawn_coordinator",
]
