"""Runs one task from claim to terminal status, or resumes one whose runner died.

Every phase is persisted before it starts (`phase`: allocating, worker, collecting, verifying),
so a new runner can pick up where a dead one stopped; every way out of `run` resolves the task
to a terminal status, unless a compare-and-set shows someone else already did (a cancel).
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from functools import cached_property
from pathlib import Path
from typing import Any

from bridge.errors import BridgeError
from bridge.models import TERMINAL, Status, TaskSpec
from bridge.pipeline.collect import collect_changes
from bridge.pipeline.context import Context
from bridge.pipeline.outcomes import Outcome, error, judge_worker, timeout_error
from bridge.pipeline.recovery import recover_stranded
from bridge.pipeline.results import redactor_for
from bridge.pipeline.scheduling import HEARTBEAT_EVERY, LEASE_TTL, wait_for_leases
from bridge.pipeline.verify import VerifyCheckout, run_verification
from bridge.pipeline.worker_run import WorkerExit, run_worker_turn
from bridge.redact import Redactor
from bridge.store.db import now_iso
from bridge.store.owners import Owner
from bridge.workers import Turn, Worker, get_worker
from bridge.workspace.baseline import Stat, record_files
from bridge.workspace.changes import (
    Change,
    list_changes,
)
from bridge.workspace.disk import check_free_space
from bridge.workspace.worktree import (
    TaskWorkspace,
    create_workspace,
    remove_workspace,
)

ACTIVE = frozenset({Status.RUNNING, Status.VERIFYING})


class Superseded(Exception):
    """The task stopped being this runner's (cancelled, or claimed by another runner)."""


class TaskRunner:
    """One attempt to run (or resume) one task. Create a new runner per attempt."""

    def __init__(self, ctx: Context, task_id: str, owner: Owner | None = None) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.task_id = task_id
        self.owner = owner or Owner()
        self.task = self.store.get_task(task_id)
        self.spec = TaskSpec.model_validate(self.task["spec"])
        self.limits = self.task["config"]["effective_limits"]
        self.redactor: Redactor = redactor_for(self.task)
        self.timings: dict[str, float] = dict(self.task.get("timings") or {})
        self.deadline_at = self.task.get("deadline_at") or 0.0
        self.baseline: dict[str, Stat] | None = None
        self.checkout: VerifyCheckout | None = None
        self.repairs = self._repairs_taken()
        self._stop = threading.Event()
        self._lost = False

    # -- small helpers ------------------------------------------------------------------------

    def emit(self, kind: str, data: dict[str, Any] | None = None) -> None:
        self.store.add_event(self.task_id, kind, self.redactor.redact_data(data or {}))

    def enter_phase(self, phase: str) -> None:
        """Persist the phase before doing its work (and honour the test pause point)."""
        if not self.store.set_phase(self.task_id, phase):
            raise Superseded("not running")
        if os.environ.get("WORKER_BRIDGE_TEST_PAUSE_AT") == phase:
            self.emit("test.paused", {"phase": phase, "pid": os.getpid()})
            time.sleep(120)

    def remaining(self) -> float:
        return self.deadline_at - time.time()

    def ensure_active(self, kill: str | None = None) -> None:
        """Raise Superseded when the task was cancelled (killing ``kill``, a container we just
        started, so a cancel racing its start cannot miss it)."""
        status = self.store.status(self.task_id)
        if self._lost or status in TERMINAL:
            if kill:
                self.ctx.sandbox.remove(kill)
            raise Superseded(status)

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run (or resume) to a terminal status; returns the stored task row."""
        if not self.store.runners.claim(self.task_id, self.owner, LEASE_TTL):
            return self.store.get_task(self.task_id)  # another live runner has it
        self._start_heartbeat()
        outcome: Outcome | None = None
        try:
            outcome = self._run_claimed()
        except Superseded:
            outcome = None
        except BridgeError as exc:
            outcome = Outcome(Status.FAILED, error(exc.kind, exc.message))
        except Exception as exc:  # the unexpected still ends in a terminal status
            self.emit("task.internal_error", {"traceback": traceback.format_exc()[-4000:]})
            outcome = Outcome(
                Status.FAILED,
                error(
                    "internal",
                    f"worker-bridge hit an internal error ({exc.__class__.__name__}: "
                    f"{str(exc)[:200]}); see `worker-bridge tasks logs {self.task_id}`.",
                ),
            )
        finally:
            self._stop.set()
            if not self._lost:  # a runner that lost its claim leaves the containers alone
                self._remove_containers()
            if self.checkout is not None:
                self.checkout.discard()
        if outcome is not None:
            self._finish(outcome)
        self.store.runners.release(self.task_id, self.owner)
        return self.store.get_task(self.task_id)

    def _run_claimed(self) -> Outcome | None:
        status = self.store.status(self.task_id)  # claim() already queued a created task
        if status == Status.QUEUED:
            return self._start_fresh()
        if status in ACTIVE:
            return self._resume()
        raise Superseded(status)

    def _start_fresh(self) -> Outcome:
        queued_at = time.time()
        self._preflight()
        wanted = lambda: self.store.status(self.task_id) == Status.QUEUED  # noqa: E731
        if not wait_for_leases(
            self.store,
            self.ctx.config,
            self.task,
            self.owner,
            still_wanted=wanted,
            on_idle=self._recover_others,
        ):
            raise Superseded("no longer queued")
        check_free_space(self.ctx.home, self.ctx.config.disk_reserve_gb)
        self.deadline_at = time.time() + self.limits["timeout_seconds"]
        if not self.store.transition(
            self.task_id,
            Status.RUNNING,
            expect={Status.QUEUED},
            phase="allocating",
            started_at=now_iso(),
            deadline_at=self.deadline_at,
        ):
            raise Superseded("claimed or cancelled")
        self.timings["queued_s"] = round(time.time() - queued_at, 3)
        return self._pipeline(resume_phase=None)

    def _resume(self) -> Outcome:
        task = self.store.get_task(self.task_id)
        self.emit("task.resumed", {"phase": task["phase"], "runner": self.owner.id})
        wanted = lambda: self.store.status(self.task_id) in ACTIVE  # noqa: E731
        if not wait_for_leases(
            self.store,
            self.ctx.config,
            self.task,
            self.owner,
            still_wanted=wanted,
            ahead_of_queue=True,
        ):
            raise Superseded("no longer active")
        return self._pipeline(resume_phase=task["phase"] or "allocating")

    def _preflight(self) -> None:
        """Fail fast, before anything is allocated: engine reachable, images present."""
        self.ctx.sandbox.ping()
        worker = self.worker
        self.ctx.sandbox.require_image(worker.image(self.ctx.config), worker.build_target)
        if self.spec.verification.commands:
            image = self._verify_image()
            ours = image == self.ctx.config.verify_image_ref
            self.ctx.sandbox.require_image(image, "verify" if ours else None)

    def _recover_others(self) -> None:
        """While waiting for capacity, a surviving runner also hands on stranded tasks."""
        recover_stranded(self.ctx)

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_EVERY):
                if not self.store.runners.heartbeat(self.task_id, self.owner, LEASE_TTL):
                    self._lost = True

        threading.Thread(target=beat, name=f"heartbeat-{self.task_id}", daemon=True).start()

    def _verify_image(self) -> str:
        return self.spec.verification.image or self.ctx.config.verify_image_ref

    # -- phases -------------------------------------------------------------------------------

    def _pipeline(self, resume_phase: str | None) -> Outcome:
        ws = TaskWorkspace.plan(self.ctx.home, Path(self.task["repository"]), self.task_id)
        turn = self._turn()
        if resume_phase is None and turn.number > 0:
            if not ws.worktree.is_dir():
                raise BridgeError(f"Task {self.task_id}'s worktree is gone; delegate a new task.")
            resume_phase = "worker"  # a follow-up turn continues on the existing worktree
        phase = resume_phase or "allocating"
        if self.remaining() <= 0:
            return Outcome(Status.TIMED_OUT, self._timeout_error(phase))
        if phase == "allocating":
            self._allocate(ws, sweep=resume_phase is not None)
            # Only a first turn in one process knows the worktree is exactly the base checkout.
            self.baseline = record_files(ws.worktree)
            phase = "worker"
        if self.spec.verification.commands:
            self.checkout = VerifyCheckout(self.ctx, ws, self.task["base_commit"], turn.number)
            if phase == "worker":
                self.checkout.start()  # checks out the base while the worker runs
        if phase == "worker":
            self.enter_phase("worker")
            t0 = time.monotonic()
            exit_info = run_worker_turn(self, ws, turn, resume=resume_phase == "worker")
            self.timings["worker_s"] = round(time.monotonic() - t0, 3)
            self.ensure_active()
            phase = "collecting"
        else:
            exit_info = WorkerExit.from_document(
                self.store.get_task(self.task_id)["worker_exit"], turn.number
            )
        if phase == "collecting":
            self.enter_phase("collecting")
            return self._collect_and_check(ws, exit_info, turn)
        task = self.store.get_task(self.task_id)
        changes = list_changes(ws.repository, task["base_commit"], task["snapshot_commit"])
        return self._verify(ws, task["snapshot_commit"], changes, turn)

    @cached_property
    def worker(self) -> Worker:
        """Resolved on first use, inside run(), so an unknown worker fails the task cleanly."""
        return get_worker(self.ctx.config, self.spec.worker)

    def _turn(self) -> Turn:
        task = self.store.get_task(self.task_id)
        number = task.get("turn") or 0
        messages = task.get("follow_ups") or []
        message = messages[number - 1] if 0 < number <= len(messages) else None
        return Turn(self.spec.objective, self.spec.metadata, number=number, message=message)

    def _allocate(self, ws: TaskWorkspace, sweep: bool) -> None:
        self.enter_phase("allocating")
        t0 = time.monotonic()
        if sweep:  # a runner died half way through: start the workspace again from nothing
            remove_workspace(self.ctx.home, ws, delete_branch=True)
        self.store.update_task(self.task_id, worktree=str(ws.worktree), branch=ws.branch)
        _, owner = self.ctx.sandbox_identity()
        create_workspace(
            self.ctx.home,
            ws,
            self.task["base_commit"],
            owner,
            timeout=self.ctx.config.allocation_timeout_s,
        )
        self.timings["prepare_s"] = round(time.monotonic() - t0, 3)
        self.emit("workspace.ready", {"worktree": str(ws.worktree), "branch": ws.branch})

    def _collect_and_check(
        self, ws: TaskWorkspace, exit_info: WorkerExit | None, turn: Turn
    ) -> Outcome:
        t0 = time.monotonic()
        snapshot, changes = collect_changes(self.ctx, ws, self.task, self.baseline)
        self.timings["collect_s"] = round(time.monotonic() - t0, 3)
        self.store.update_task(
            self.task_id,
            summary=exit_info.summary if exit_info else None,
            snapshot_commit=snapshot,
            changed_files=[c.result_entry() for c in changes],
        )
        verdict = judge_worker(exit_info, changes, self.spec, self.limits, self.task_id)
        if verdict is not None:
            return verdict  # _finish redacts the error
        return self._verify(ws, snapshot, changes, turn)

    def _verify(
        self, ws: TaskWorkspace, snapshot: str, changes: list[Change], turn: Turn
    ) -> Outcome:
        commands = self.spec.verification.commands
        if not commands:
            return Outcome(
                Status.SUCCEEDED,
                fields={"verification": {"ok": None, "image": None, "commands": []}},
            )
        status = self.store.status(self.task_id)
        if status != Status.VERIFYING and not self.store.transition(
            self.task_id, Status.VERIFYING, expect={Status.RUNNING}, phase="verifying"
        ):
            raise Superseded("not running")
        self.enter_phase("verifying")
        self.ctx.sandbox.remove_by_labels(
            {"io.worker-bridge.task": self.task_id, "io.worker-bridge.role": "verify"}
        )
        self.emit("verification.started", {"commands": commands, "image": self._verify_image()})
        t0 = time.monotonic()
        checkout = self.checkout or VerifyCheckout(
            self.ctx, ws, self.task["base_commit"], turn.number
        )
        outcome = run_verification(
            self.ctx,
            ws,
            checkout,
            snapshot,
            changes,
            commands,
            self._verify_image(),
            self.limits,
            self.remaining(),
            self.redactor,
            self.emit,
            turn.number,
        )
        self.ensure_active()
        self.timings["verify_s"] = round(time.monotonic() - t0, 3)
        doc = outcome.document()
        self.emit("verification.completed", {"ok": outcome.ok})
        if outcome.timed_out:
            return Outcome(
                Status.TIMED_OUT,
                self._timeout_error("verification was running"),
                {"verification": doc},
            )
        if not outcome.ok:
            bad = next(c for c in outcome.commands if c["exit_code"] != 0)
            if self._may_repair():
                return self._repair(turn, bad, doc)
            return Outcome(
                Status.FAILED,
                error(
                    "verification_failed",
                    f"Verification command `{bad['command']}` exited with status "
                    f"{bad['exit_code']}.",
                ),
                {"verification": doc},
            )
        return Outcome(Status.SUCCEEDED, fields={"verification": doc})

    def _repairs_taken(self) -> int:
        """Repair turns since the task's last explicit turn (from the log, so a runner that
        resumes a task after a crash does not get a fresh budget)."""
        events = self.store.query(
            "SELECT kind FROM events WHERE task_id = ? AND kind IN"
            " ('task.follow_up', 'verification.auto_repair') ORDER BY event_id",
            (self.task_id,),
        )
        taken = 0
        for event in events:
            taken = 0 if event["kind"] == "task.follow_up" else taken + 1
        return taken

    def _may_repair(self) -> bool:
        """Auto-repair budget: metadata.auto_repair, else config auto_repair (0 disables)."""
        budget = self.spec.metadata.get("auto_repair", self.task["config"].get("auto_repair", 0))
        return self.repairs < int(budget) and self.worker.can_repair(self.spec.metadata)

    def _repair(self, turn: Turn, bad: dict[str, Any], doc: dict[str, Any]) -> Outcome:
        """Give the worker another turn with what failed, then collect and verify again."""
        self.repairs += 1
        message = (
            f"Verification failed: `{bad['command']}` exited with status {bad['exit_code']}.\n"
            f"stdout (end):\n{bad['stdout_tail']}\nstderr (end):\n{bad['stderr_tail']}\n"
            "Fix the cause so that the command succeeds."
        )
        follow_ups = [*(self.store.get_task(self.task_id).get("follow_ups") or []), message]
        self.emit(
            "verification.auto_repair",
            {"turn": len(follow_ups), "repair": self.repairs, "command": bad["command"]},
        )
        if not self.store.transition(
            self.task_id,
            Status.RUNNING,
            expect={Status.VERIFYING},
            turn=len(follow_ups),
            follow_ups=follow_ups,
            verification=doc,
            phase="worker",
        ):
            raise Superseded("not verifying")
        return self._pipeline(resume_phase="worker")

    def _timeout_error(self, phase: str) -> dict[str, str]:
        return timeout_error(self.limits, phase)

    # -- the end ------------------------------------------------------------------------------

    def _remove_containers(self) -> None:
        try:
            self.ctx.sandbox.remove_by_labels({"io.worker-bridge.task": self.task_id})
        except BridgeError:
            return  # the engine is gone: a container may live on, so keep it on record
        self.store.update_task(self.task_id, container_id=None)

    def _finish(self, outcome: Outcome) -> None:
        fields = dict(outcome.fields)
        fields["timings"] = self.timings
        fields["finished_at"] = now_iso()
        fields["phase"] = None
        fields["error"] = self.redactor.redact_data(outcome.error) if outcome.error else None
        event = {"error": fields["error"]} if outcome.error else {}
        self.store.transition(self.task_id, outcome.status, event=event, **fields)
