"""The deterministic ranking of a compete's candidates, a pure function of their figures.

Eligible first: the candidate's task succeeded, our own verification (in a clean container the
candidate never touched) ran and passed, and nothing it changed broke a protected path or a
policy. Eligible candidates are then ordered by fewer changed lines, fewer files, a shorter run
and fewer tokens, in that order, and each decision is recorded with the values it was made on.
An ineligible candidate is never ranked above an eligible one, whatever any judge says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.documents import Check, RankedCandidate

# The error kinds that mean the candidate broke a rule, not merely failed.
POLICY_KINDS = ("protected_path", "symlink_escape", "binary_change", "network", "disk")

TIE_BREAKS = (
    ("changed_lines", "fewer changed lines"),
    ("files", "fewer files"),
    ("duration_s", "shorter run"),
    ("tokens", "fewer tokens"),
)


@dataclass(frozen=True)
class Candidate:
    """What a candidate is ranked on (gathered from its task by figures.py)."""

    task_id: str
    label: str  # its slot in the job (c1, c2...), never shown to a judge
    worker: str
    status: str
    verification_ok: bool | None
    error_kind: str | None = None
    error_message: str | None = None
    changed_lines: int = 0
    lines_added: int = 0
    lines_removed: int = 0
    files: int = 0
    duration_s: float = 0.0
    tokens: int = 0
    checks: list[Check] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    # The snapshot it was ranked on: accepting through the job takes this change or none.
    snapshot_commit: str | None = None


def eligibility(candidate: Candidate) -> tuple[bool, list[str]]:
    """Whether the candidate may win, with the reasons either way."""
    reasons: list[str] = []
    if candidate.error_kind in POLICY_KINDS:
        reasons.append(f"ineligible: {candidate.error_kind} ({candidate.error_message})")
    if candidate.status == "rejected":  # rejected while the job ran (`tasks reject`)
        reasons.append("ineligible: the task was rejected")
    elif candidate.status not in ("succeeded", "accepted"):
        reasons.append(f"ineligible: the task ended {candidate.status}")
    if candidate.verification_ok is not True:
        why = "did not run" if candidate.verification_ok is None else "failed"
        reasons.append(f"ineligible: our verification {why}")
    if reasons:
        return False, reasons
    return True, ["eligible: our verification passed and no protected path or policy was broken"]


def _key(candidate: Candidate) -> tuple:
    return (*(getattr(candidate, name) for name, _ in TIE_BREAKS), candidate.label)


def _decided_by(better: Candidate, worse: Candidate) -> str:
    """Which tie-break put ``better`` above ``worse``, with both values."""
    for name, words in TIE_BREAKS:
        a, b = getattr(better, name), getattr(worse, name)
        if a != b:
            return f"{words} than {worse.label} ({name} {a} < {b})"
    return f"equal on every figure to {worse.label}; kept in slot order"


def rank(candidates: list[Candidate]) -> list[RankedCandidate]:
    """The candidates best first: eligible ones by the tie-breaks, then the ineligible in slot
    order. Each entry: the figures, `eligible`, `rank` (1-based; null when ineligible) and
    `reasons[]`, which name the tie-break that placed it above the next eligible one."""
    judged = [(c, *eligibility(c)) for c in candidates]
    eligible = sorted((c for c, ok, _ in judged if ok), key=_key)
    ineligible = [(c, reasons) for c, ok, reasons in judged if not ok]
    reasons_of = {c.task_id: reasons for c, ok, reasons in judged}
    ranked: list[RankedCandidate] = []
    for n, candidate in enumerate(eligible):
        reasons = list(reasons_of[candidate.task_id])
        if n + 1 < len(eligible):
            reasons.append(f"ranked above {_decided_by(candidate, eligible[n + 1])}")
        ranked.append(_entry(candidate, True, n + 1, reasons))
    for candidate, reasons in ineligible:
        ranked.append(_entry(candidate, False, None, reasons))
    return ranked


def _entry(
    candidate: Candidate, eligible: bool, rank: int | None, reasons: list[str]
) -> RankedCandidate:
    """The candidate's figures (every field of Candidate) with its place and the reasons."""
    c = candidate
    return RankedCandidate(
        task_id=c.task_id,
        label=c.label,
        worker=c.worker,
        status=c.status,
        verification_ok=c.verification_ok,
        error_kind=c.error_kind,
        error_message=c.error_message,
        changed_lines=c.changed_lines,
        lines_added=c.lines_added,
        lines_removed=c.lines_removed,
        files=c.files,
        duration_s=c.duration_s,
        tokens=c.tokens,
        checks=list(c.checks),
        paths=list(c.paths),
        snapshot_commit=c.snapshot_commit,
        eligible=eligible,
        rank=rank,
        reasons=reasons,
    )
