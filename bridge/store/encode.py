"""How records become the store's rows: the values of JSON columns encoded (a record dumps
itself), and the row of a new task from creation's record. The Store (db.py) and the jobs
table write through these."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

from pydantic import BaseModel

from bridge.models import Status
from bridge.records import NewTask


def plain(value: object) -> object:
    """JSON-ready data from records and lists of records (pydantic models dump themselves)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def new_task_columns(task: NewTask, now: str) -> dict[str, object]:
    """The tasks row of a new task (its JSON columns not encoded yet): the spec's own fields in
    their columns, and the configuration as recorded (config's keys, the effective limits and
    the profile applied)."""
    spec = task.spec
    config = task.config.model_dump(mode="json")
    config["effective_limits"] = task.limits.model_dump()
    config["task_profile"] = task.profile
    return {
        "task_id": task.task_id,
        "status": str(Status.CREATED),
        "worker": spec.worker,
        "objective": spec.objective,
        "repository": task.repository,
        "base_ref": spec.workspace.base_ref,
        "base_commit": task.base_commit,
        "priority": spec.priority,
        "idempotency_key": spec.idempotency_key,
        "spec": spec.model_dump(mode="json"),
        "config": config,
        "job_id": task.job_id,
        "job_role": task.job_role,
        "job_label": task.job_label,
        "created_at": now,
        "updated_at": now,
        "turn": 0,
    }


def encode(fields: Mapping[str, object], json_columns: Collection[str]) -> dict[str, object]:
    """``fields`` (column -> value) with the values of ``json_columns`` as JSON text (None
    stays NULL)."""
    return {
        key: json.dumps(plain(value)) if key in json_columns and value is not None else value
        for key, value in fields.items()
    }
