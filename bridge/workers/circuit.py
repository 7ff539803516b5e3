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

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from bridge.config.settings import CircuitConfig, Config
from bridge.documents import RESUME_FAILED, CircuitDoc, ResetDoc
from bridge.errors import CircuitOpen
from bridge.events import ProbeReleased
from bridge.models import TERMINAL, Status
from bridge.records import NewTask
from bridge.store import Store
from bridge.store import circuits as table
from bridge.store.circuits import CircuitRow, OpenedFor, TaskOutcome
from bridge.store.sql import Connection

log = logging.getLogger(__name__)


WORKED = {Status.SUCCEEDED, Status.ACCEPTED, Status.REJECTED}
FORGET_AFTER_S = 7 * 86400  # failures older than this (and than the window) are removed
PROBE_GRACE_S = 60.0  # the least time a probe without a live runner holds the one try
# A lost session in the bridge's own words: the CLI's name, then the phrase (`Codex could not
# resume its session (...)`); the phrase quoted from what a CLI or its model said (`Codex
# failed: ... could not resume its session`) is that CLI's failure.
_LOST_SESSION = re.compile(rf"[A-Za-z][\w .-]{{0,40}} {re.escape(RESUME_FAILED)}\b")


def classify(outcome: TaskOutcome, settings: CircuitConfig | None = None) -> tuple[str, str | None]:
    """("failure", kind), ("worked", None) or ("neutral", None) for a task as
    store.circuits.task_outcome reads it (see the module's docstring)."""
    settings = settings or CircuitConfig()
    status, kind, ran = outcome.status, outcome.error_kind, outcome.worker_exit
    if status not in TERMINAL or status == Status.CANCELLED:
        return "neutral", None
    if ran is None or ran.turn != outcome.turn:  # the worker did not run this turn
        return "worked" if status in WORKED else "neutral", None
    if kind == "worker_exit":  # the worker ran this turn and failed...
        if outcome.turn and _LOST_SESSION.match(ran.failure or ""):
            return "neutral", None  # ...to resume the earlier turns' session: not a broken worker
        return "failure", "worker_exit"
    if status == Status.TIMED_OUT and ran.timed_out:
        deadline = outcome.timeout_seconds
        if deadline is None or deadline >= settings.min_timeout_s:
            return "failure", "timeout"
        return "neutral", None  # the caller's own short budget, not a hanging worker
    if status in WORKED:
        return "worked", None
    clean = ran.exit_code == 0 and not (ran.timed_out or ran.oom_killed or ran.over_limit)
    return ("worked", None) if clean else ("neutral", None)


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

    def document(self) -> CircuitDoc:
        return CircuitDoc(
            state=self.state,
            failures=self.failures,
            kinds=dict(self.kinds),
            retry_at=_iso(self.retry_at),
            probe_task=self.probe_task,
        )

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
                f"after {self._failed()}; new tasks for it are refused until that task ends or "
                f"is found stuck (or {reset})."
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
    """Each worker's breaker, read without writing (a store not made yet: all closed) --
    except that a half-open probe that has ended, or no longer holds the one try
    (probe_due), is settled first (as the next creation would), so no one is shown a
    breaker "tried by" a task that is over."""
    names = list(workers)
    now = time.time()
    settings = config.circuit
    after = now - settings.window_s
    rows, counted, probes = table.read_circuits(config.store_path, after)
    due = {n for n in names if n in probes and probe_due(rows[n], probes[n], settings, now)}
    if due and _settle_ended(config, due):
        rows, counted, _ = table.read_circuits(config.store_path, after)
    return {
        name: view(rows.get(name) or CircuitRow(worker=name), counted.get(name, {}), settings, now)
        for name in names
    }


def _settle_ended(config: Config, workers: set[str]) -> bool:
    """Settle the probes of ``workers``; False when the store cannot be written here (a
    read-only home: the stored state is shown)."""
    try:
        store = Store(config.store_path)
    except Exception:  # a read-only home, a locked store: show it as stored
        return False
    try:
        for worker in sorted(workers):
            with store.transaction() as conn:
                _settled(store, conn, config.circuit, table.load(conn, worker), time.time())
        return True
    except Exception:  # the same: this is a view, not a decision
        return False
    finally:
        store.close()


def probe_due(
    current: CircuitRow, probe: TaskOutcome | None, settings: CircuitConfig, now: float
) -> str | None:
    """Why the probe task ``probe`` (None: gone) no longer holds the one try: `gone`,
    `ended` (its outcome to apply), or why it is stale; None while it holds it. A probe with
    no live runner (made and never started, its runner dead, waiting for input) holds it for
    the cool-down (and at least PROBE_GRACE_S) from when it was let through, and one a live
    runner holds until its own deadline plus as long. So a probe whose outcome is never
    recorded cannot hold a breaker half-open for good."""
    if probe is None or probe.status in TERMINAL:
        return "gone" if probe is None else "ended"
    grace = max(settings.cooldown_s, PROBE_GRACE_S)
    if not probe.runner_live:
        if now - (current.probe_at or 0.0) > grace:
            return "unstarted" if probe.status == Status.CREATED else "no_live_runner"
        return None
    deadline_at = probe.deadline_at
    if deadline_at and now > deadline_at + grace:
        return "past_its_deadline"
    return None


# -- changes: each inside one store transaction --------------------------------------------


def admission(
    store: Store, config: Config, task: NewTask
) -> Callable[[Connection], Exception | None]:
    """The check `Store.insert_task` runs in its transaction before it writes ``task``: a
    refusal (CircuitOpen, the sentence) while the worker's breaker is open, or half-open with
    its one task taken; in half-open, make this task that one. A job's task never probes. What
    it settled on the way (an ended probe's outcome) is committed even when it refuses: a
    refusal must not undo it, or a probe that failed unrecorded would move the retry forward
    on every attempt."""
    settings = config.circuit

    def admit(conn: Connection) -> Exception | None:
        if settings.failures == 0:
            return None
        now = time.time()
        worker, task_id = task.spec.worker, task.task_id
        current = _settled(store, conn, settings, table.load(conn, worker), now)
        circuit = view(current, {}, settings, now)
        if circuit.admits:
            return None
        if circuit.state == "open" or current.probe_task or task.job_id:
            return CircuitOpen(circuit.refusal(for_job=bool(task.job_id)), worker=worker)
        table.save(conn, replace(current, probe_task=task_id, probe_at=now))
        probe = circuit.document()
        probe["probe_task"] = task_id
        store.event_in(conn, task_id, "circuit.probe", probe)
        return None

    return admit


def record_outcome(store: Store, config: Config, task_id: str) -> None:
    """After a task ended: count its failure, open the breaker when that makes enough in the
    window, and close or reopen it when the task was the half-open probe, by the `circuit`
    section recorded with the task (``config``'s only for a task recorded without one; see
    _apply). Applying it twice changes nothing (a failure is counted once per task and turn,
    at the time the task ended). Raises what the store raises; record_task_outcome does not."""
    with store.transaction() as conn:
        outcome = table.task_outcome(conn, task_id)
        if outcome is not None and outcome.status in TERMINAL:
            _apply(store, conn, config.circuit, outcome, time.time())


def record_task_outcome(store: Store, config: Config, task_id: str) -> bool:
    """The one entry point for whoever ended a task (bridge/pipeline/finish.py, a held task
    finished by an answer or a sweep): record_outcome, which never raises: a failure to
    record is logged on the task as a `circuit.unrecorded` event (best effort) and False
    returned; the task's outcome stands either way."""
    try:
        record_outcome(store, config, task_id)
        return True
    except Exception as exc:  # the bookkeeping must not undo or interrupt the caller
        why = f"{exc.__class__.__name__}: {exc}"[:300]
        log.warning("circuit: task %s's outcome not recorded: %s", task_id, why)
        try:
            store.add_event(task_id, "circuit.unrecorded", {"error": why})
        except Exception:  # noqa: S110 - the log line above says it
            pass
        return False


@dataclass(frozen=True)
class Reset:
    """What `workers reset` did: the worker's breaker is closed; ``before`` is how it was."""

    worker: str
    before: Circuit

    def document(self) -> ResetDoc:
        return ResetDoc(worker=self.worker, state="closed", before=self.before.document())


def reset(store: Store, config: Config, worker: str) -> Reset:
    """Close the worker's breaker: failures so far no longer count, a probe in flight no
    longer decides anything."""
    now = time.time()
    with store.transaction() as conn:
        before = table.load(conn, worker, damaged_as_closed=True)
        recent = table.failure_kinds(conn, worker, _since(before, config.circuit, now))
        table.save(conn, CircuitRow(worker=worker, closed_at=now))
    return Reset(worker, view(before, recent, config.circuit, now))


def _since(current: CircuitRow, settings: CircuitConfig, now: float) -> float:
    """Failures after this count: within the window, and after the last close."""
    return max(current.closed_at, now - settings.window_s)


def _released(
    store: Store, conn: Connection, current: CircuitRow, data: ProbeReleased | None
) -> CircuitRow:
    """The row with its probe let go (the next new task tries the worker instead); with
    ``data``, a `circuit.probe_released` event on the probe says why."""
    released = replace(current, probe_task=None, probe_at=None)
    table.save(conn, released)
    if data is not None and current.probe_task:
        store.event_in(conn, current.probe_task, "circuit.probe_released", data)
    return released


def _settled(
    store: Store, conn: Connection, settings: CircuitConfig, current: CircuitRow, now: float
) -> CircuitRow:
    """The row once a probe that has ended (or is gone) has had its outcome applied, and a
    probe that no longer holds the one try (probe_due) has let go of it: whoever looks
    first does it, and doing it twice changes nothing."""
    if not current.probe_task:
        return current
    probe = table.task_outcome(conn, current.probe_task)
    why = probe_due(current, probe, settings, now)
    if probe is None or why is None:
        return current if why is None else _released(store, conn, current, None)
    if why == "ended":
        return _apply(store, conn, settings, probe, now)
    return _released(store, conn, current, ProbeReleased(why=why, status=probe.status))


def _apply(
    store: Store, conn: Connection, settings: CircuitConfig, outcome: TaskOutcome, now: float
) -> CircuitRow:
    """Apply a task's ending with the `circuit` section it was made with, whichever process
    applies it (its runner, an answer's denial, a creation settling a probe): the same
    ending always counts the same way. ``settings``: for a task recorded without one."""
    settings = _recorded(outcome, settings)
    verdict, kind = classify(outcome, settings)
    worker, task_id = outcome.worker, outcome.task_id
    at = min(outcome.ended_at or now, now)  # when it failed, however late we learn it
    current = table.load(conn, worker)
    if verdict == "failure" and not table.add_failure(
        conn, worker, task_id, outcome.turn, kind or "", at
    ):
        return current  # counted already: its consequences were applied then
    if verdict == "failure":  # what no window reaches any more is never read again
        table.forget_failures(conn, worker, now - max(settings.window_s, FORGET_AFTER_S))
    if current.state == "open" and current.probe_task == task_id:
        if verdict == "failure":
            changed = _opened(conn, settings, current, at, now)
        elif verdict == "worked":
            changed = CircuitRow(worker=worker, closed_at=now)
        else:
            changed = _released(store, conn, current, None)
    elif verdict == "failure" and current.state != "open" and settings.failures > 0:
        since = _since(current, settings, now)
        if not _enough(conn, settings, worker, since):
            return current
        changed = _opened(conn, settings, current, at, now)
    else:
        return current
    table.save(conn, changed)
    if verdict == "neutral":
        what = "circuit.probe_released"  # the next new task tries the worker instead
    else:
        what = "circuit.opened" if changed.state == "open" else "circuit.closed"
    store.event_in(conn, task_id, what, view(changed, {}, settings, now).document())
    return changed


def _recorded(outcome: TaskOutcome, settings: CircuitConfig) -> CircuitConfig:
    try:
        return CircuitConfig.model_validate(outcome.circuit) if outcome.circuit else settings
    except ValueError:  # a section this version cannot read (a newer one's): ours
        return settings


def _enough(conn: Connection, settings: CircuitConfig, worker: str, since: float) -> bool:
    """K failures since ``since``, from at least two repositories -- or from the one
    repository the worker was given tasks in since then: one repository whose tasks make the
    worker fail (its tests, a prompt planted in it) does not shut it out of the others."""
    if sum(table.failure_kinds(conn, worker, since).values()) < settings.failures:
        return False
    failed_in = table.failure_repositories(conn, worker, since)
    return failed_in >= min(2, table.repositories_used(conn, worker, since))


def _opened(
    conn: Connection, settings: CircuitConfig, current: CircuitRow, at: float, now: float
) -> CircuitRow:
    """The breaker opened by the failure at ``at``: it refuses until ``at`` plus the
    cool-down, so applying the same failure again (or late) gives the same retry time."""
    kinds = table.failure_kinds(conn, current.worker, _since(current, settings, now))
    return CircuitRow(
        worker=current.worker,
        state="open",
        opened_at=at,
        retry_at=at + settings.cooldown_s,
        closed_at=current.closed_at,
        reason=OpenedFor(kinds=kinds, window_s=settings.window_s),
    )
