"""Jobs: several tasks advanced together by one coordinator (compete: one objective on several
candidates, ranked by our own verification and optionally a judge). The facade
(bridge/service/facade.py) is the front ends' only door here; see docs/jobs.md."""

from typing import Any

__all__ = [
    "chosen_candidate",
    "job_result",
    "new_compete_row",
    "recover_jobs",
    "spawn_coordinator",
]


_HOMES = {
    "new_compete_row": "bridge.jobs.creation",
    "recover_jobs": "bridge.jobs.detached",
    "spawn_coordinator": "bridge.jobs.detached",
    "chosen_candidate": "bridge.jobs.results",
    "job_result": "bridge.jobs.results",
}


def __getattr__(name: str) -> Any:
    """The names above load with their module on first use: the facade's read verbs import
    bridge.service.jobs (and so this package) without the coordinator behind them."""
    if name not in _HOMES:
        raise AttributeError(f"module 'bridge.jobs' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)
