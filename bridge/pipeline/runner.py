"""Runs one task from claim to terminal status, or resumes one whose runner died.

Every phase is persisted before it starts (`phase`: allocating, environment, worker, collecting,
verifying), so a new runner can pick up where a dead one stopped; every way out of `run` ends the
task in a terminal status (or `waiting_input`), unless a compare-and-set shows someone else did.
It runs with the task's recorded configuration; each phase has its own module and the same
`PhaseHandle`; a failed verification with budget left becomes a repair turn in `_turns`."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.cluster.link import NodeOverdue
from bridge.environments.task import SetupTimedOut, SnapshotSetupFailed, TaskEnvironment
from bridge.errors import BridgeError, SandboxError
from bridge.models import TERMINAL, Status
from bridge.phase.context import Context
from bridge.phase.handle import PhaseHandle, PipelineHooks, Superseded
from bridge.phase.run_container import interrupts_held
from bridge.pipeline.answer import asked, wait_for_input
from bridge.pipeline.checkout import VerifyCheckout
from bridge.pipeline.collect import (
    Collected,
    CollectTimedOut,
    collect_changes,
    disarm_workspace,
    write_artifacts,
)
from bridge.pipeline.finish import fail_unreadable, finish_task
from bridge.pipeline.outcomes import (
    Outcome,
    approved_paths,
    binary_refusal,
    error,
    judge_worker,
    repair_message,
    repairs_taken,
    timeout_error,
    verification_failed,
)
from bridge.pipeline.prepare import prepare_workspace, remount_workspace
from bridge.pipeline.recovery import recover_stranded
from bridge.pipeline.results import redactor_for
from bridge.pipeline.scheduling import HEARTBEAT_EVERY, LEASE_TTL, wait_for_leases
from bridge.pipeline.verify import run_verification
from bridge.pipeline.worker_turn import run_worker_turn
from bridge.records import CommandResult, TaskRecord, VerificationDoc
from bridge.sandbox import require_image
from bridge.sandbox.runtimes import runtime_check
from bridge.store.db import now_iso
from bridge.store.owners import Owner
from bridge.workers import Turn, Worker, get_worker
from bridge.workspace.baseline import Stat, record_files
from bridge.workspace.diff import Change, list_changes
from bridge.workspace.worktree import TaskWorkspace

if TYPE_CHECKING:
    from bridge.cluster.link import Nodes
    from bridge.documents import WorkerExit

ACTIVE = frozenset({Status.RUNNING, Status.VERIFYING})


class TaskRunner:
    """One attempt to run (or resume) one task. Create a new runner per attempt."""

    def __init__(
        self,
        ctx: Context,
        task_id: str,
        owner: Owner | None = None,
        hooks: PipelineHooks | None = None,
    ) -> None:
        self.base_ctx = ctx
        self.store = ctx.store
        self.task_id = task_id
        self.owner = owner or Owner()
        self.hooks = hooks
        self._stop = threading.Event()
        self._lost = False
        self._resumed = False  # this runner took over a task another one had started
        self._checkout: VerifyCheckout | None = None
        self._waiting: Outcome | None = None  # the outcome held while the task waits for input
        self._lost_nodes: set[str] = set()  # cluster nodes lost during this runner's turns

    # -- the run ----------------------------------------------------------------------------

    def run(self, on_claimed: Callable[[], None] | None = None) -> TaskRecord:
        """Run (or resume) to a terminal status; returns the stored record. ``on_claimed`` is
        called once the claim is this runner's. An interrupt (KeyboardInterrupt: Ctrl-C) takes
        the task's containers and what this runner mounted away, then goes on: the task is left
        for a cancel (`tasks run` cancels it) or recovery to resolve; any other BaseException
        leaves it as a crash would."""
        if not self.store.runners.claim(self.task_id, self.owner, LEASE_TTL):
            return self.store.load_task(self.task_id)  # another live runner has it
        if on_claimed is not None:
            on_claimed()
        self._start_heartbeat()
        try:
            handle = self._handle()
        except Exception as exc:  # a record this version cannot read still ends the task
            self._stop.set()
            fail_unreadable(self.store, self.task_id, exc)
            self.store.runners.release(self.task_id, self.owner)
            return self.store.load_task(self.task_id)
        try:
            outcome = self._outcome(handle)
        finally:
            self._stop.set()
        self.store.leases.release(self.task_id, self.owner)  # no container left: next task
        if outcome is not None and outcome is self._waiting:
            wait_for_input(self.ctx, handle, outcome)  # after the clean-up: no container left
        elif outcome is not None:
            finish_task(handle, outcome)
        self._release_node(outcome)
        self.store.runners.release(self.task_id, self.owner)
        return self.store.load_task(self.task_id)

    def _handle(self) -> PhaseHandle:
        self.record = record = self.store.load_task(self.task_id)
        self.ctx = self.base_ctx.with_config(record.config)
        self.follow_ups = list(record.follow_ups)
        self.snapshot = record.snapshot_commit  # the latest turn's, the start of the next
        self.repairs = repairs_taken(self.store, self.task_id)
        handle = PhaseHandle(
            task_id=self.task_id,
            record=record,
            ctx=self.ctx,
            redactor=redactor_for(record),
            deadline_at=record.deadline_at or 0.0,
            lost=lambda: self._lost,
            hooks=self.hooks,
            timings=dict(record.timings),
        )
        self.env = TaskEnvironment(handle, lambda: self.worker)
        return handle

    def _outcome(self, handle: PhaseHandle) -> Outcome | None:
        """The outcome to finish with (None: someone else ended the task), after cleaning up.
        An interrupt cleans up and is raised again (the process lives on: nothing it made is
        left for the next recovery); any other BaseException skips the clean-up, as the death
        of the process would."""
        outcome: Outcome | None = None
        try:
            outcome = self._run_claimed(handle)
        except KeyboardInterrupt:
            with interrupts_held():  # a second Ctrl-C would leave half of it
                self._clean_up()
            raise
        except Superseded:
            pass
        except SetupTimedOut:
            outcome = Outcome(
                Status.TIMED_OUT, timeout_error(handle.limits, "the environment's setup ran")
            )
        except CollectTimedOut:  # a node's collect (one here is judged in `_turn`)
            outcome = Outcome(Status.TIMED_OUT, timeout_error(handle.limits, "collecting"))
        except NodeOverdue as exc:
            outcome = Outcome(Status.TIMED_OUT, timeout_error(handle.limits, exc.phase))
        except BridgeError as exc:
            outcome = Outcome(Status.FAILED, error(exc.kind, exc.message))
        except Exception as exc:  # the unexpected still ends in a terminal status
            handle.emit("task.internal_error", {"traceback": traceback.format_exc()[-4000:]})
            outcome = Outcome(
                Status.FAILED,
                error(
                    "internal",
                    f"worker-bridge hit an internal error ({exc.__class__.__name__}: "
                    f"{str(exc)[:200]}); see `worker-bridge tasks logs {self.task_id}`.",
                ),
            )
        self._clean_up()
        return outcome

    def _clean_up(self) -> None:
        """Remove the task's containers, then what they had mounted (never the other way: a
        checkout a container still holds is never moved into the trash)."""
        if not self._lost:  # a runner that lost its claim leaves the containers alone
            try:
                self.ctx.sandbox.remove_by_labels({"io.worker-bridge.task": self.task_id})
                self.store.update_task(self.task_id, container_id=None)
                self.env.discard()  # the setups made for its snapshots
            except BridgeError:
                pass  # the engine is gone: a container may live on, so keep it on record
        if self._checkout is not None:
            self._checkout.discard()

    def _cluster(self) -> Nodes | None:
        """The cluster's nodes when this state root's tasks run on a cluster (config
        `cluster.address`, or nodes given); None: on this host."""
        if self.ctx.nodes is None and self.ctx.config.cluster.address:
            from bridge.pipeline.nodes import cluster_nodes

            self.ctx.nodes = cluster_nodes(self.ctx.config.cluster)
        return self.ctx.nodes

    def _release_node(self, outcome: Outcome | None) -> None:
        """A task that ran on nodes and will not run there again: they let go of it (its
        workspace, its shadow). One waiting for an answer keeps its worker's node for the next
        turn; one this runner was superseded in (outcome None) is let go only once it ended (a
        cancel), never when another runner took it over."""
        record = self.store.load_task(self.task_id)
        if self.ctx.nodes is None or self._lost:
            return
        if outcome is None and record.status not in TERMINAL:
            return
        from bridge.pipeline.node_turn import nodes_placed, release_task

        used = {record.worker_node, record.verify_node} | nodes_placed(
            self.ctx.nodes, self.store, self.task_id
        )
        if outcome is not None and outcome is self._waiting:
            used.discard(record.worker_node)

        for node in sorted(n for n in used if n):
            if not release_task(self.ctx.nodes, node, self.task_id):
                self.store.add_event(self.task_id, "cluster.release_failed", {"node": node})

    def _run_claimed(self, handle: PhaseHandle) -> Outcome:
        status = self.store.status(self.task_id)  # claim() already queued a created task
        if status == Status.QUEUED:
            return self._start_fresh(handle)
        if status in ACTIVE:
            return self._resume(handle)
        raise Superseded(status)

    def _start_fresh(self, handle: PhaseHandle) -> Outcome:
        queued_at = time.time()
        self._preflight()
        if not wait_for_leases(
            self.store,
            self.record,
            self.owner,
            still_wanted=self._still_queued,
            on_idle=lambda: recover_stranded(self.ctx),
        ):
            raise Superseded("no longer queued")
        handle.deadline_at = time.time() + handle.limits.timeout_seconds
        if not self.store.transition(
            self.task_id,
            Status.RUNNING,
            expect={Status.QUEUED},
            phase="allocating",
            started_at=now_iso(),
            deadline_at=handle.deadline_at,
        ):
            raise Superseded("claimed or cancelled")
        handle.timings["queued_s"] = round(time.time() - queued_at, 3)
        return self._turns(handle, resume_phase=None)

    def _resume(self, handle: PhaseHandle) -> Outcome:
        self._resumed = True
        handle.emit("task.resumed", {"phase": self.record.phase, "runner": self.owner.id})
        if not wait_for_leases(
            self.store,
            self.record,
            self.owner,
            still_wanted=self._still_active,
            ahead_of_queue=True,
        ):
            raise Superseded("no longer active")
        return self._turns(handle, resume_phase=self.record.phase or "allocating")

    def _still_queued(self) -> bool:
        return self.store.status(self.task_id) == Status.QUEUED

    def _still_active(self) -> bool:
        return self.store.status(self.task_id) in ACTIVE

    def _preflight(self) -> None:
        """Fail fast, before anything is allocated: engine reachable (its first call), images."""
        sandbox = self.ctx.sandbox
        runtime = self.ctx.config.runtime
        if runtime:
            usable, why = runtime_check(runtime, sandbox.runtimes())
            if not usable:
                raise SandboxError(why)
        require_image(sandbox, self.worker.image(self.ctx.config), self.worker.build_target)
        if self.record.spec.verification.commands and self.env.definition is None:
            image = self._verify_image()
            ours = image == self.ctx.config.verify_image_ref
            require_image(sandbox, image, "verify" if ours else None)

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_EVERY):
                if not self.store.runners.heartbeat(self.task_id, self.owner, LEASE_TTL):
                    self._lost = True

        threading.Thread(target=beat, name=f"heartbeat-{self.task_id}", daemon=True).start()

    def _verify_image(self) -> str:
        return self.record.spec.verification.image or self.ctx.config.verify_image_ref

    @cached_property
    def worker(self) -> Worker:
        """Resolved on first use, inside run(), so an unknown worker fails the task cleanly."""
        return get_worker(self.ctx.config, self.record.spec.worker)

    # -- turns ------------------------------------------------------------------------------

    def _turns(self, handle: PhaseHandle, resume_phase: str | None) -> Outcome:
        """The task's turns: the current one, then a repair turn after each failed
        verification while the repair budget lasts."""
        ws = TaskWorkspace.plan(self.ctx.home, Path(self.record.repository), self.task_id)
        spec = self.record.spec
        number = self.record.turn
        turn = Turn(
            spec.objective,
            spec.metadata,
            number,
            self.record.follow_up_message,
            session_id=self.record.session_id,
            permission=spec.permission,
        )
        nodes = self._cluster()
        if resume_phase is None and turn.number > 0 and nodes is None:
            if not ws.worktree.is_dir():
                raise BridgeError(f"Task {self.task_id}'s worktree is gone; delegate a new task.")
            phase, resuming = "worker", None  # a follow-up continues on the existing worktree
        else:
            phase, resuming = resume_phase or "allocating", resume_phase
        while True:
            if handle.remaining() <= 0:
                return Outcome(Status.TIMED_OUT, timeout_error(handle.limits, phase))
            if nodes is not None:
                outcome, failure = self._node_turn(handle, ws, turn, phase, nodes)
            else:
                outcome, failure = self._turn(handle, ws, turn, phase, resuming)
            if asked(handle, turn.number):
                self._waiting = outcome  # the caller answers first; a repair can wait
                return outcome
            if failure is None or not self._may_repair():
                return outcome
            turn = self._repair_turn(handle, failure, outcome.fields["verification"])
            phase, resuming = "worker", None

    def _turn(
        self,
        handle: PhaseHandle,
        ws: TaskWorkspace,
        turn: Turn,
        phase: str,
        resuming: str | None,
    ) -> tuple[Outcome, CommandResult | None]:
        """One turn from ``phase`` on; the outcome, and the failed command when verification
        failed (which a repair turn may fix)."""
        baseline: dict[str, Stat] | None = None
        if phase == "allocating":
            prepare_workspace(handle, ws, sweep=resuming is not None)
            phase = "worker" if self.env.definition is None else "environment"
        else:
            remount_workspace(handle, ws)  # a layered one whose mount is gone (a reboot)
        if phase == "environment":
            self.env.enter(ws)
            phase = "worker"
        if phase == "worker" and resuming != "worker" and ws.upper is None:
            # A worker about to start here: stat tells what it touches (an upper dir needs none).
            baseline = record_files(ws.worktree, limit=handle.limits.files)
        base = self.record.base_commit or ""
        if self.record.spec.verification.commands:
            self._checkout = VerifyCheckout(handle, ws, base, turn.number)
            if phase == "worker":
                self._checkout.start(self.env.given())  # checks out the base while it runs
        exit_info = self.record.worker_exit if resuming else None
        if exit_info is not None and exit_info.turn != turn.number:
            exit_info = None  # recorded for an earlier turn
        if phase == "worker":
            handle.enter_phase("worker")
            t0 = time.monotonic()
            resume, env = resuming == "worker", self.env.ready()
            exit_info = run_worker_turn(handle, ws, self.worker, turn, resume=resume, env=env)
            handle.timed("worker_s", t0)
            handle.ensure_active()
            phase = "collecting"
        if exit_info is not None and exit_info.over_limit:
            disarm_workspace(handle, ws)  # not collected: its set-user-id bits go all the same
            return Outcome(Status.FAILED, error("disk", exit_info.over_limit)), None
        if phase == "collecting":
            handle.enter_phase("collecting")
            t0 = time.monotonic()
            start = self.snapshot if turn.number > 0 and self.snapshot else base
            try:
                collected = collect_changes(handle, ws, start, baseline)
            except CollectTimedOut:
                disarm_workspace(handle, ws)
                return Outcome(Status.TIMED_OUT, timeout_error(handle.limits, "collecting")), None
            handle.timed("collect_s", t0)
            verdict = self._judge(handle, exit_info, collected)
            if verdict is not None:
                return verdict, None  # finish_task redacts the error
            snapshot, changes = collected.snapshot, collected.changes
        else:
            snapshot = self.record.snapshot_commit or ""
            changes = list_changes(ws.repository, base, snapshot)
        return self._verify(handle, ws, snapshot, changes, turn)

    def _judge(
        self, handle: PhaseHandle, exit_info: WorkerExit | None, collected: Collected
    ) -> Outcome | None:
        """The turn's collected changes recorded, and the judge's verdict on them (None: on to
        verification)."""
        self.snapshot = collected.snapshot
        handle.update(
            summary=exit_info.summary if exit_info else None,
            snapshot_commit=collected.snapshot,
            changed_files=handle.redactor.redact_data(collected.changed_files()),
            dropped=handle.redactor.redact_data([d.document() for d in collected.dropped]),
        )
        allowed = approved_paths(self.store, self.task_id)  # by the caller, when asked
        spec, limits = self.record.spec, handle.limits
        return judge_worker(
            exit_info, collected.changes, spec, limits, self.task_id, allowed
        ) or binary_refusal(collected.made_binary, spec, self.record.job_id is not None)

    def _node_turn(
        self, handle: PhaseHandle, ws: TaskWorkspace, turn: Turn, phase: str, nodes: Nodes
    ) -> tuple[Outcome, CommandResult | None]:
        """One turn whose worker runs on a node of the cluster (docs/cluster.md); the
        artifacts, the judge and the checks are this host's, as after a local turn. A turn
        resumed before its checks runs again: the node's half of it is not adopted. A node
        lost during a first turn has it run again on another node while the repair budget
        lasts."""
        from bridge.cluster.link import NodeLost
        from bridge.pipeline.node_turn import release_task, run_node_turn

        if self.env.definition is not None:
            raise BridgeError(
                "Project environments do not run on a cluster yet; unset cluster.address for "
                "this task's state root, or give the task no environment.",
                kind="cluster",
            )
        base = self.record.base_commit or ""
        if phase == "verifying":
            snapshot = self.record.snapshot_commit or ""
            return self._verify(
                handle, ws, snapshot, list_changes(ws.repository, base, snapshot), turn
            )
        if turn.number == 0:
            handle.enter_phase("allocating")
            handle.update(branch=ws.branch)
        handle.enter_phase("worker")
        start = self.snapshot if turn.number > 0 and self.snapshot else base
        avoid: set[str] = set()
        while True:
            t0 = time.monotonic()
            try:
                done = run_node_turn(
                    handle, ws, self.worker, turn, start, nodes, self.owner, avoid=frozenset(avoid)
                )
                break
            except NodeLost as exc:
                self._lost_nodes.add(exc.node)
                handle.emit("cluster.node_lost", {"node": exc.node, "turn": turn.number})
                # The same turn again elsewhere: it spends the repair budget, but asks the
                # worker to act on no follow-up (can_repair does not matter).
                if turn.number > 0 or not self._budget_left():
                    raise
                self.repairs += 1
                avoid.add(exc.node)
                release_task(nodes, exc.node, self.task_id)
            finally:
                handle.timed("worker_s", t0)
        handle.ensure_active()
        if done.exit.over_limit or done.snapshot is None:
            if done.exit.over_limit:
                return Outcome(Status.FAILED, error("disk", done.exit.over_limit)), None
            missing = f"Node {done.node} sent no snapshot of the worker's changes."
            return Outcome(Status.FAILED, error("cluster", missing)), None
        handle.enter_phase("collecting")
        t0 = time.monotonic()
        collected = write_artifacts(handle, ws.repository, done.snapshot)
        handle.timed("collect_s", t0)
        verdict = self._judge(handle, done.exit, collected)
        if verdict is not None:
            return verdict, None
        return self._verify(handle, ws, collected.snapshot, collected.changes, turn)

    def _verify(
        self,
        handle: PhaseHandle,
        ws: TaskWorkspace,
        snapshot: str,
        changes: list[Change],
        turn: Turn,
    ) -> tuple[Outcome, CommandResult | None]:
        commands = self.record.spec.verification.commands
        if not commands:
            return Outcome(Status.SUCCEEDED, fields={"verification": VerificationDoc()}), None
        status = self.store.status(self.task_id)
        if status != Status.VERIFYING and not self.store.transition(
            self.task_id, Status.VERIFYING, expect={Status.RUNNING}, phase="verifying"
        ):
            raise Superseded("not running")
        handle.enter_phase("verifying")
        if self._resumed or turn.number:  # an earlier runner's verifier may be left (~30 ms)
            self.ctx.sandbox.remove_by_labels(self.ctx.labels(self.task_id, "verify"))
        t0 = time.monotonic()
        try:
            env, env_doc = self.env.for_verification(snapshot, changes, full=len(commands) - 1)
        except SnapshotSetupFailed as exc:  # the worker's dependency files did not set up
            doc = VerificationDoc(ok=False, environment=exc.document)
            return Outcome(Status.FAILED, error(exc.kind, exc.message), {"verification": doc}), None
        image = env.image if env is not None else self._verify_image()
        handle.emit("verification.started", {"commands": commands, "image": image})
        base = self.record.base_commit or ""
        if self.ctx.nodes is not None:
            from bridge.pipeline.node_turn import Checks, run_node_checks

            checks = Checks(snapshot, changes, commands, image, turn.number)
            avoid = frozenset(self._lost_nodes)
            outcome = run_node_checks(handle, ws, checks, self.ctx.nodes, self.owner, avoid=avoid)
        else:
            checkout = self._checkout or VerifyCheckout(handle, ws, base, turn.number)
            outcome = run_verification(
                handle, checkout, snapshot, changes, commands, image, turn.number, env
            )
        outcome.environment = env_doc
        handle.ensure_active()
        handle.timed("verify_s", t0)
        handle.emit("verification.completed", {"ok": outcome.ok})
        doc = outcome.document()
        if outcome.timed_out:
            return Outcome(
                Status.TIMED_OUT,
                timeout_error(handle.limits, "verification was running"),
                {"verification": doc},
            ), None
        bad = outcome.first_failure
        if bad is not None:
            return Outcome(Status.FAILED, verification_failed(bad), {"verification": doc}), bad
        return Outcome(Status.SUCCEEDED, fields={"verification": doc}), None

    # -- repair -----------------------------------------------------------------------------

    def _may_repair(self) -> bool:
        """Auto-repair budget left, and a worker whose repair turn can change anything."""
        return self._budget_left() and self.worker.can_repair(self.record.spec.metadata)

    def _budget_left(self) -> bool:
        """Auto-repair budget: metadata.auto_repair, else config auto_repair (0 disables)."""
        budget = self.record.spec.metadata.get("auto_repair")
        if budget is None:
            budget = self.ctx.config.auto_repair
        return self.repairs < int(budget)

    def _repair_turn(self, handle: PhaseHandle, bad: CommandResult, doc: VerificationDoc) -> Turn:
        """Record a repair turn (the worker is told what failed) and return it."""
        self.repairs += 1
        message = repair_message(bad)
        follow_ups = [*self.follow_ups, message]
        handle.emit(
            "verification.auto_repair",
            {"turn": len(follow_ups), "repair": self.repairs, "command": bad.command},
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
        self.follow_ups = follow_ups
        spec = self.record.spec
        return Turn(
            spec.objective,
            spec.metadata,
            len(follow_ups),
            message,
            session_id=self.store.load_task(self.task_id).session_id,  # the earlier turn's
            permission=spec.permission,
        )
