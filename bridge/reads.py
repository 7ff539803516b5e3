"""The facade's reads that start at once: the task result documents of `tasks show` and `tasks
list`, built straight from the store's rows with the standard library, for a CLI process that
does nothing else. Loading the models (pydantic) and the configuration costs a short command
most of its time; a read needs neither while the store is where it is by default and every
repository's tasks may be shown (bridge/config_names.py: `default_store_root`).

Each function answers exactly what `WorkerBridge.get_task(...).document()` / `list_tasks(...)`
would, or None when it cannot tell cheaply (a config.yaml; a variable that moves the store,
bounds the repositories or names no key; a store that needs making or migrating; an unknown
task id; an empty listing): the caller then asks the facade, which also says what is wrong.
tests/test_reads.py holds the two ways equal on every kind of task."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bridge.config_names import default_store_root
from bridge.redact import task_redactor
from bridge.requests import approved_hosts, approved_paths, listed_patterns, request_document
from bridge.sandbox.host_paths import require_state_root
from bridge.store import rows

# Defaults of the stored documents' fields (bridge/records.py), filled in the models' order.
_VERIFICATION = {"ok": None, "image": None, "commands": [], "environment": None}
_COMMAND = {
    "command": None,
    "exit_code": None,
    "duration_s": None,
    "stdout_tail": "",
    "stderr_tail": "",
    "status": None,
    "note": None,
}
_REQUEST = {"attempts": 1, "turn": 0, "expires_at": None, "answer": None, "delivered_turn": None}


def show_task(task_id: str) -> dict[str, Any] | None:
    """`get_task(task_id).document()`, or None (see the module's docstring)."""
    found = _documents("SELECT * FROM tasks WHERE task_id = ?", [task_id])
    return found[0] if found else None


def list_tasks(status: str | None = None, limit: int | None = None) -> list[dict] | None:
    """The documents of `list_tasks(status, limit)`, or None (see the module's docstring)."""
    return _documents(*rows.tasks_query(status, limit)) or None


def _documents(sql: str, params: list[Any]) -> list[dict[str, Any]] | None:
    home = default_store_root()
    if home is None:
        return None
    require_state_root(home)
    with rows.reader(home / "bridge.db") as run:
        if run is None:
            return None
        tasks = [rows.decode_task(row) for row in run(sql, params)]
        ids = [task["task_id"] for task in tasks]
        artifacts = rows.artifacts_of(run, ids) if ids else {}
        requests = rows.requests_of(run, ids)
    try:
        return [
            task_document(
                task, artifacts.get(task["task_id"], {}), requests.get(task["task_id"], [])
            )
            for task in tasks
        ]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a row this version would not write (another version's): the facade says


def task_document(
    row: dict[str, Any], artifacts: dict[str, str], requests: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """The task result document (`TaskResult.document()`) of a decoded tasks row, its
    artifacts and its decoded request rows."""
    spec, config = row["spec"], row.get("config") or {}
    redactor = task_redactor(spec, config)
    asked = [SimpleNamespace(**{**_REQUEST, **_present(r)}) for r in requests or []]
    network = spec.get("network") or {}
    listed = listed_patterns(network.get("mode", "none"), network.get("domains", []), asking=False)
    verification = row.get("verification")
    return {
        "task_id": row["task_id"],
        "status": row["status"],
        "worker": row["worker"],
        "objective": redactor.redact(row["objective"]),
        "summary": row.get("summary"),
        "changed_files": [_changed_file(c) for c in row.get("changed_files") or []],
        "dropped": row.get("dropped") or [],
        "verification": _verification(verification) if verification is not None else None,
        "artifacts": {name: artifacts[name] for name in ("diff", "manifest") if name in artifacts},
        "error": row.get("error"),
        "timings": {k: float(v) for k, v in (row.get("timings") or {}).items()},
        "session_id": row.get("session_id"),
        "usage": row.get("usage"),
        "repository": row["repository"],
        "base_commit": row.get("base_commit"),
        "branch": row.get("branch"),
        "phase": row.get("phase"),
        "created_at": row["created_at"],
        "finished_at": row.get("finished_at"),
        "job_id": row.get("job_id"),
        "job_role": row.get("job_role"),
        "profile": config.get("task_profile"),
        "requests": [request_document(r, redactor) for r in asked],  # type: ignore[arg-type]
        "allowlist": (listed or []) + approved_hosts(asked),  # type: ignore[arg-type]
        "approved_paths": approved_paths(asked),  # type: ignore[arg-type]
    }


def _present(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if v is not None}


def _changed_file(change: dict[str, Any]) -> dict[str, Any]:
    shown = {k: v for k, v in change.items() if k != "from"}
    if change.get("from") is not None:
        shown["from"] = change["from"]
    return shown


def _verification(doc: dict[str, Any]) -> dict[str, Any]:
    shown = {**_VERIFICATION, **doc}
    shown["commands"] = [{**_COMMAND, **command} for command in shown["commands"] or []]
    return shown
