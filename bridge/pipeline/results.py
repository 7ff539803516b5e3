"""The task result of the contract (`TaskResult`), built from a task's record."""

from __future__ import annotations

from bridge.asking import approved_hosts, approved_paths, listed_domains, request_document
from bridge.documents import RequestRecord
from bridge.records import TaskRecord, TaskResult
from bridge.redact import Redactor, task_redactor


def redactor_for(record: TaskRecord) -> Redactor:
    """A redactor that already knows the secrets visible in the task's own spec."""
    return task_redactor(record.spec_doc, record.config_doc)


def task_result(
    record: TaskRecord,
    artifacts: dict[str, str],
    redactor: Redactor | None = None,
    requests: list[RequestRecord] | None = None,
) -> TaskResult:
    redactor = redactor or redactor_for(record)
    requests = requests or []
    allowlist = (listed_domains(record.spec, asking=False) or []) + approved_hosts(requests)
    return TaskResult(
        task_id=record.task_id,
        status=record.status,
        worker=record.worker,
        objective=redactor.redact(record.objective),
        summary=record.summary,
        changed_files=record.changed_files,
        dropped=record.dropped,
        verification=record.verification,
        artifacts={n: artifacts[n] for n in ("diff", "readable", "manifest") if n in artifacts},
        error=record.error,
        timings=record.timings,
        usage=record.usage,
        session_id=record.session_id,
        worker_node=record.worker_node,
        verify_node=record.verify_node,
        repository=record.repository,
        base_commit=record.base_commit,
        branch=record.branch,
        phase=record.phase,
        created_at=record.created_at,
        updated_at=record.updated_at,
        finished_at=record.finished_at,
        job_id=record.job_id,
        job_role=record.job_role,
        profile=record.profile,
        requests=[request_document(r, redactor) for r in requests],
        allowlist=allowlist,
        approved_paths=approved_paths(requests),
    )
