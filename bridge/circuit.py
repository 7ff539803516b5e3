"""The circuit breaker per worker, kept in the store so every process sees one state.

A worker that is broken (its key refused, its CLI crashing, its model never answering) fails
every task it gets. After `circuit.failures` such failures within `circuit.window_s`, new
tasks for it are refused at creation for `circuit.cooldown_s`; then it is half-open: exactly
one new task is let through (the probe, taken by a compare-and-set in the same transaction
that writes the task, so a flood of creations from any number of processes lets one through),
and that task's outcome closes the circuit or opens it again. `workers reset` closes it.

What counts, decided from how a task ended (its status, error kind and recorded exit), after
every repair turn it had, so a failed check that a repair fixed never counts:

- a failure: error kind `worker_exit` (the CLI exited non-zero; a refused key or a rate limit
  ends that way, with the CLI's own account), or a deadline passed while the worker was
  running (`timed_out` with the worker's turn timed out);
- the worker worked: the task succeeded, or the worker's turn exited 0 and the task failed
  or timed out later (a failed verification, a protected path, slow checks): that is the
  worker's code, not a broken worker, and counting it would shut a healthy worker out of a
  repository whose tests fail;
- neither: a cancel, and everything that is not the worker's (the engine, an image, the
  environment's setup, disk, memory limits, our own internal errors, a deadline passed before
  the worker ran). A probe ending so frees the half-open slot for the next task.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from bridge.config import CircuitConfig, Config
from bridge.errors import CircuitOpen
from bridge.models import TERMINAL, Status
from bridge.store import Store
from bridge.store import circuits as table
from bridge.store.circuits import CircuitRow

WORKED = {Status.SUCCEEDED, Status.ACCEPTED, Status.REJECTED}
FORGET_AFTER_S = 7 * 86400  # failures older than this (and than the window) are removed
UNSTARTED_PROBE_S = 60.0  # a probe still `created` this long (and a cool-down) lets go its try


def classify(outcome: dict[str, Any]) -> tuple[str, str | None]:
    """("failure", kind), ("worked", None) or ("neutral", None) for a task as
    store.circuits.task_outcome reads it (see the module's docstring)."""
    status = outcome["status"]
    kind = (outcome.get("error") or {}).get("kind")
    ran = outcome.get("worker_exit") or {}
    this_turn = ran.get("turn") == outcome.get("turn")
    if status not in TERMINAL or status == Status.CANCELLED:
        return "neutral", None
    if kind == "worker_exit":
        return "failure", "worker_exit"
    if status == Status.TIMED_OUT and this_turn and ran.get("timed_out"):
        return "failure", "timeout"
    if status in WORKED:
        return "worked", None
    clean = ran.get("exit_code") == 0 and not any(
        ran.get(key) for key in ("timed_out", "oom_killed", "over_limit")
    )
    return ("worked", None) if this_turn and clean else ("neutral", None)


def _iso(at: float | None) -> str | None:
    if at is None:
        return None
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _kinds_text(kinds: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "none recorded"


@dataclass(frozen=True)
class Circuit:
    """A worker's breaker as a caller sees it: ``state`` is `closed`, `open` (refusing until
    ``retry_at``), `half_open` (one task let through: ``probe_task`` once taken) or
    `disabled` (config `circuit.failures: 0`); ``failures`` and ``kinds`` are the failures
    that opened it, or when closed those counted in the window now."""

    worker: str
    state: str
    failures: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    retry_at: float | None = None
    probe_task: str | None = None
    window_s: float = 0.0

    @property
    def admits(self) -> bool:
        return self.state in ("closed", "disabled")

    def document(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "failures": self.failures,
            "kinds": dict(self.kinds),
            "retry_at": _iso(self.retry_at),
            "probe_task": self.probe_task,
        }

    def _failed(self) -> str:
        return (
            f"{self.failures} failure{'s' if self.failures != 1 else ''} within "
            f"{self.window_s:g} s that no repair fixed ({_kinds_text(self.kinds)})"
        )

    def refusal(self, for_job: bool = False) -> str:
        """The one sentence a refused creation gets."""
        reset = f"`worker-bridge workers reset {self.worker}`"
        if self.state == "open":
            return (
                f"Worker '{self.worker}' is refused until {_iso(self.retry_at)}: its circuit "
                f"breaker opened after {self._failed()}; {reset} closes it sooner."
            )
        if self.probe_task:
            return (
                f"Worker '{self.worker}' is being tried again with task {self.probe_task} "
                f"after {self._failed()}; new tasks for it are refused until that task ends "
                f"(or {reset})."
            )
        if for_job:
            return (
                f"Worker '{self.worker}' is half-open after {self._failed()}: one single task "
                f"tries it again, never a job's; run one task on it, or {reset}."
            )
        return (
            f"Worker '{self.worker}' is half-open after {self._failed()}: the next new task "
            "for it tries it again."
        )

    def clause(self) -> str:
        """This breaker in a few words, for a sentence about several workers."""
        when = f"until {_iso(self.retry_at)}" if self.state == "open" else "being tried again"
        return f"'{self.worker}' {when} after {self.failures} failures ({_kinds_text(self.kinds)})"


def view(row: CircuitRow, recent: dict[str, int], settings: CircuitConfig, now: float) -> Circuit:
    """The state a stored row means at ``now`` (``recent``: the worker's failures counted in
    the window, shown for a closed breaker)."""
    window = settings.window_s
    if row.state == "open" and row.retry_at is not None and settings.failures > 0:
        kinds = dict(row.reason.get("kinds") or {})
        window = float(row.reason.get("window_s") or window)  # the window it opened in
        state = "open" if now < row.retry_at else "half_open"
        probe = row.probe_task if state == "half_open" else None
        return Circuit(row.worker, state, sum(kinds.values()), kinds, row.retry_at, probe, window)
    state = "disabled" if settings.failures == 0 else "closed"
    return Circuit(row.worker, state, sum(recent.values()), dict(recent), window_s=window)


def circuits_of(config: Config, workers: Iterable[str]) -> dict[str, Circuit]:
    """Each worker's breaker, read without writing (a store not made yet: all closed)."""
    now = time.time()
    settings = config.circuit
    rows, counted = table.read_circuits(config.store_path, now - settings.window_s)
    return {
        name: view(rows.get(name) or CircuitRow(worker=name), counted.get(name, {}), settings, now)
        for name in workers
    }


# -- changes: each inside one store transaction --------------------------------------------


def admission(store: Store, config: Config, row: dict[str, Any]) -> Callable[[Any], None]:
    """The check `Store.insert_task` runs in its transaction for the task ``row``: refuse
    (CircuitOpen, the sentence) while the worker's breaker is open, or half-open with its one
    task taken; in half-open, make this task that one. A job's task never probes."""
    settings = config.circuit

    def admit(conn: Any) -> None:
        if settings.failures == 0:
            return
        now = time.time()
        worker, task_id = row["worker"], row["task_id"]
        current = _settled(store, conn, settings, table.load(conn, worker), now)
        circuit = view(current, {}, settings, now)
        if circuit.admits:
            return
        if circuit.state == "open" or current.probe_task or row.get("job_id"):
            raise CircuitOpen(circuit.refusal(for_job=bool(row.get("job_id"))), worker=worker)
        table.save(conn, replace(current, probe_task=task_id, probe_at=now))
        store.event_in(
            conn, task_id, "circuit.probe", {**circuit.document(), "probe_task": task_id}
        )

    return admit


def record_outcome(store: Store, config: Config, task_id: str) -> None:
    """After a task ended: count its failure, open the breaker when that makes enough in the
    window, and close or reopen it when the task was the half-open probe."""
    with store.transaction() as conn:
        outcome = table.task_outcome(conn, task_id)
        if outcome is not None:
            _apply(store, conn, config.circuit, outcome, time.time())


@dataclass(frozen=True)
class Reset:
    """What `workers reset` did: the worker's breaker is closed; ``before`` is how it was."""

    worker: str
    before: Circuit

    def document(self) -> dict[str, Any]:
        return {"worker": self.worker, "state": "closed", "before": self.before.document()}


def reset(store: Store, config: Config, worker: str) -> Reset:
    """Close the worker's breaker: failures so far no longer count, a probe in flight no
    longer decides anything."""
    now = time.time()
    with store.transaction() as conn:
        before = table.load(conn, worker)
        recent = table.failure_kinds(
            conn, worker, max(before.closed_at, now - config.circuit.window_s)
        )
        table.save(conn, CircuitRow(worker=worker, closed_at=now))
    return Reset(worker, view(before, recent, config.circuit, now))


def _settled(
    store: Store, conn: Any, settings: CircuitConfig, current: CircuitRow, now: float
) -> CircuitRow:
    """The row once a probe that has ended (or is gone) has had its outcome applied: whoever
    looks first applies it, and applying it twice changes nothing."""
    if not current.probe_task:
        return current
    probe = table.task_outcome(conn, current.probe_task)
    if probe is None:
        current = replace(current, probe_task=None, probe_at=None)
        table.save(conn, current)
        return current
    if probe["status"] == Status.CREATED and now - (current.probe_at or now) > max(
        settings.cooldown_s, UNSTARTED_PROBE_S
    ):  # made and never started (a script that died?): it no longer holds the one try
        current = replace(current, probe_task=None, probe_at=None)
        table.save(conn, current)
        store.event_in(conn, probe["task_id"], "circuit.probe_released", {"unstarted": True})
        return current
    if probe["status"] not in TERMINAL:
        return current
    return _apply(store, conn, settings, probe, now)


def _apply(
    store: Store, conn: Any, settings: CircuitConfig, outcome: dict[str, Any], now: float
) -> CircuitRow:
    verdict, kind = classify(outcome)
    worker, task_id = outcome["worker"], outcome["task_id"]
    current = table.load(conn, worker)
    if verdict == "failure" and not table.add_failure(
        conn, worker, task_id, outcome["turn"], kind or "", now
    ):
        return current  # counted already: its consequences were applied then
    if verdict == "failure":  # what no window reaches any more is never read again
        table.forget_failures(conn, worker, now - max(settings.window_s, FORGET_AFTER_S))
    if current.state == "open" and current.probe_task == task_id:
        if verdict == "failure":
            changed = _opened(conn, settings, current, now)
        elif verdict == "worked":
            changed = CircuitRow(worker=worker, closed_at=now)
        else:
            changed = replace(current, probe_task=None, probe_at=None)
    elif verdict == "failure" and current.state != "open" and settings.failures > 0:
        since = max(current.closed_at, now - settings.window_s)
        if sum(table.failure_kinds(conn, worker, since).values()) < settings.failures:
            return current
        changed = _opened(conn, settings, current, now)
    else:
        return current
    table.save(conn, changed)
    if verdict == "neutral":
        what = "circuit.probe_released"  # the next new task tries the worker instead
    else:
        what = "circuit.opened" if changed.state == "open" else "circuit.closed"
    store.event_in(conn, task_id, what, view(changed, {}, settings, now).document())
    return changed


def _opened(conn: Any, settings: CircuitConfig, current: CircuitRow, now: float) -> CircuitRow:
    since = max(current.closed_at, now - settings.window_s)
    kinds = table.failure_kinds(conn, current.worker, since)
    return CircuitRow(
        worker=current.worker,
        state="open",
        opened_at=now,
        retry_at=now + settings.cooldown_s,
        closed_at=current.closed_at,
        reason={"count": sum(kinds.values()), "kinds": kinds, "window_s": settings.window_s},
    )
