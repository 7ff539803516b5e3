"""The task result document of the contract, built from a stored task row."""

from __future__ import annotations

from typing import Any

from bridge.redact import Redactor


def redactor_for(task: dict[str, Any]) -> Redactor:
    """A redactor that already knows the secrets visible in the task's own spec."""
    redactor = Redactor()
    redactor.redact_data(task.get("spec") or {})
    return redactor


def task_result(
    task: dict[str, Any], artifacts: dict[str, str], redactor: Redactor | None = None
) -> dict[str, Any]:
    redactor = redactor or redactor_for(task)
    return {
        "task_id": task["task_id"],
        "status": task["status"],
        "worker": task["worker"],
        "objective": redactor.redact(task["objective"]),
        "summary": task.get("summary"),
        "changed_files": task.get("changed_files") or [],
        "verification": task.get("verification"),
        "artifacts": {name: artifacts[name] for name in ("diff", "manifest") if name in artifacts},
        "error": task.get("error"),
        "timings": task.get("timings") or {},
        "repository": task["repository"],
        "base_commit": task.get("base_commit"),
        "branch": task.get("branch"),
        "phase": task.get("phase"),
        "created_at": task["created_at"],
        "finished_at": task.get("finished_at"),
    }
