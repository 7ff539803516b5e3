"""A candidate's figures, read from its finished task: status, our verification per check, the
lines and files its diff changed (a file git shows as binary counted by its text, as collect
noted it: never as 0), how long it ran and the tokens its model route reported."""

from __future__ import annotations

from pathlib import Path

from bridge.documents import Check
from bridge.jobs.ranking import Candidate
from bridge.records import TaskRecord
from bridge.workspace.readable import changed_lines


def diff_lines(path: Path | None) -> tuple[int, int]:
    """(added, removed) lines of a unified diff file (a binary file's base85 counts none);
    (0, 0) when there is none."""
    if path is None or not path.is_file():
        return 0, 0
    with path.open("rb") as diff:
        return changed_lines(diff)


def binary_lines(record: TaskRecord) -> tuple[int, int]:
    """(added, removed) lines of the files git shows as binary, as collect counted their text."""
    notes = [f.binary for f in record.changed_files if f.binary]
    return sum(n["lines_added"] for n in notes), sum(n["lines_removed"] for n in notes)


def _tokens(record: TaskRecord) -> int:
    by_model = (record.usage.get("tokens") if record.usage else None) or {}
    return sum(
        int(counts.get("input", 0)) + int(counts.get("output", 0))
        for counts in by_model.values()
        if isinstance(counts, dict)
    )


def candidate_of(record: TaskRecord, diff: str | None) -> Candidate:
    added, removed = diff_lines(Path(diff) if diff else None)
    hidden_added, hidden_removed = binary_lines(record)
    added, removed = added + hidden_added, removed + hidden_removed
    verification = record.verification
    checks = [
        Check(command=c.command, exit_code=c.exit_code, passed=c.passed)
        for c in (verification.commands if verification else [])
    ]
    timings = record.timings
    return Candidate(
        task_id=record.task_id,
        label=record.job_label or record.task_id,
        worker=record.worker,
        status=str(record.status),
        verification_ok=verification.ok if verification else None,
        error_kind=record.error.kind if record.error else None,
        error_message=record.error.message if record.error else None,
        changed_lines=added + removed,
        lines_added=added,
        lines_removed=removed,
        files=len(record.changed_files),
        duration_s=round(sum(v for k, v in timings.items() if k != "queued_s"), 3),
        tokens=_tokens(record),
        checks=checks,
        paths=[f.path for f in record.changed_files],
        snapshot_commit=record.snapshot_commit,
    )
