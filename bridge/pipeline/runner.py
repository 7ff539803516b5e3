"""Runs one task from claim to terminal status. Every phase is persisted before it starts and
every path out of `run` resolves the task to a terminal status (or leaves it to whoever won a
compare-and-set race, e.g. a cancel)."""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.errors import BridgeError
from bridge.models import Status, TaskSpec
from bridge.pipeline.context import Context
from bridge.pipeline.results import redactor_for
from bridge.pipeline.verify import run_verification
from bridge.redact import Redactor
from bridge.sandbox import ContainerSpec, Mount
from bridge.store.db import now_iso
from bridge.workers import INPUTS_DIR, Turn, get_worker
from bridge.workspace.changes import (
    list_changes,
    protected_violations,
    write_diff,
    write_manifest,
)
from bridge.workspace.worktree import (
    CONTAINER_GITDIR,
    CONTAINER_OBJECTS,
    TaskWorkspace,
    create_workspace,
    snapshot_worktree,
)

LEASE_TTL = 30.0
HEARTBEAT_EVERY = 5.0
MAX_LINE = 2000


@dataclass
class _Outcome:
    status: Status
    error: dict[str, str] | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def _error(kind: str, message: str) -> dict[str, str]:
    return {"kind": kind, "message": message}


class TaskRunner:
    """One attempt to run one task. Create a new runner per attempt."""

    def __init__(self, ctx: Context, task_id: str) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.task_id = task_id
        self.owner = f"runner-{uuid.uuid4().hex[:12]}"
        self.task = self.store.get_task(task_id)
        self.spec = TaskSpec.model_validate(self.task["spec"])
        self.limits = self.task["config"]["effective_limits"]
        self.redactor: Redactor = redactor_for(self.task)
        self.timings: dict[str, float] = {}
        self.deadline = 0.0
        self._stop_heartbeat = threading.Event()

    # -- events -----------------------------------------------------------------------------

    def emit(self, kind: str, data: dict[str, Any] | None = None) -> None:
        self.store.add_event(self.task_id, kind, self.redactor.redact_data(data or {}))

    def set_phase(self, phase: str) -> None:
        self.store.update_task(self.task_id, phase=phase)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run to a terminal status; returns the stored task row."""
        created = time.time()
        if self.task["status"] == Status.CREATED:
            self.store.transition(self.task_id, Status.QUEUED)
        try:
            self._preflight()
            if not self._acquire_leases():
                return self.store.get_task(self.task_id)
            if not self.store.transition(
                self.task_id,
                Status.RUNNING,
                expect={Status.QUEUED},
                phase="allocating",
                started_at=now_iso(),
            ):
                return self.store.get_task(self.task_id)  # someone else claimed or cancelled it
            self.timings["queued_s"] = round(time.time() - created, 3)
            self.deadline = time.monotonic() + self.limits["timeout_seconds"]
            self._start_heartbeat()
            outcome = self._execute()
        except BridgeError as exc:
            outcome = _Outcome(Status.FAILED, _error(exc.kind, exc.message))
        except Exception as exc:  # the unexpected still ends in a terminal status
            self.emit("task.internal_error", {"traceback": traceback.format_exc()[-4000:]})
            outcome = _Outcome(
                Status.FAILED,
                _error(
                    "internal",
                    f"worker-bridge hit an internal error ({exc.__class__.__name__}: "
                    f"{str(exc)[:200]}); see `worker-bridge tasks logs`.",
                ),
            )
        finally:
            self._stop_heartbeat.set()
            self._cleanup_containers()
            self.store.release_leases(self.task_id, self.owner)
        self._finish(outcome)
        return self.store.get_task(self.task_id)

    def _preflight(self) -> None:
        """Fail fast, before anything is allocated: engine reachable, images present."""
        self.ctx.sandbox.ping()
        worker = get_worker(self.ctx.config, self.spec.worker)
        self.ctx.sandbox.require_image(worker.image(self.ctx.config), worker.build_target)
        if self.spec.verification.commands:
            image = self._verify_image()
            ours = image == self.ctx.config.verify_image_ref
            self.ctx.sandbox.require_image(image, "verify" if ours else None)

    def _verify_image(self) -> str:
        return self.spec.verification.image or self.ctx.config.verify_image_ref

    def _acquire_leases(self) -> bool:
        scopes = {
            "global": self.ctx.config.max_concurrency,
            f"repo:{self.task['repository']}": self.ctx.config.repo_concurrency,
        }
        delay = 0.05
        while not self.store.acquire_leases(self.task_id, self.owner, scopes, LEASE_TTL):
            if self.store.get_task(self.task_id)["status"] != Status.QUEUED:
                return False
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        return True

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop_heartbeat.wait(HEARTBEAT_EVERY):
                self.store.renew_leases(self.owner, LEASE_TTL)

        threading.Thread(target=beat, name=f"heartbeat-{self.task_id}", daemon=True).start()

    def _execute(self) -> _Outcome:
        t0 = time.monotonic()
        ws = TaskWorkspace.plan(self.ctx.home, Path(self.task["repository"]), self.task_id)
        self.store.update_task(self.task_id, worktree=str(ws.worktree), branch=ws.branch)
        _, owner = self.ctx.sandbox_identity()
        create_workspace(self.ctx.home, ws, self.task["base_commit"], owner)
        self.timings["prepare_s"] = round(time.monotonic() - t0, 3)
        self.emit("workspace.ready", {"worktree": str(ws.worktree), "branch": ws.branch})
        return self.run_turn(ws, Turn(self.spec.objective, self.spec.metadata))

    def run_turn(self, ws: TaskWorkspace, turn: Turn) -> _Outcome:
        """Worker container, collect, verify: one turn on an allocated workspace."""
        self.set_phase("worker")
        t0 = time.monotonic()
        exit_info, summary, tail = self._run_worker(ws, turn)
        self.timings["worker_s"] = round(time.monotonic() - t0, 3)

        self.set_phase("collecting")
        t0 = time.monotonic()
        snapshot, changes = self._collect(ws)
        self.timings["collect_s"] = round(time.monotonic() - t0, 3)
        fields = {
            "summary": summary,
            "snapshot_commit": snapshot,
            "changed_files": [c.result_entry() for c in changes],
        }
        self.store.update_task(self.task_id, **fields)

        if exit_info.timed_out:
            return _Outcome(Status.TIMED_OUT, self._timeout_error("the worker was running"))
        if exit_info.oom_killed:
            return _Outcome(
                Status.FAILED,
                _error(
                    "out_of_memory",
                    f"The worker ran out of memory (limit {self.limits['memory_mb']} MB, "
                    "limits.memory_mb); raise the limit or narrow the task.",
                ),
            )
        if exit_info.exit_code != 0:
            last = self.redactor.redact(tail.strip()[:300])
            return _Outcome(
                Status.FAILED,
                _error(
                    "worker_exit",
                    f"The worker exited with status {exit_info.exit_code}"
                    + (f" (last output: {last})" if last else "")
                    + f"; see `worker-bridge tasks logs {self.task_id}`.",
                ),
            )
        hits = protected_violations(changes, self.spec.verification.protected_paths)
        if hits:
            return _Outcome(
                Status.FAILED,
                _error(
                    "protected_path",
                    f"The worker changed protected path '{self.redactor.redact(hits[0])}' "
                    "(verification.protected_paths); the change was not verified.",
                ),
            )
        return self._verify(ws, snapshot, turn)

    def _verify(self, ws: TaskWorkspace, snapshot: str, turn: Turn) -> _Outcome:
        commands = self.spec.verification.commands
        if not commands:
            return _Outcome(
                Status.SUCCEEDED,
                fields={"verification": {"ok": None, "image": None, "commands": []}},
            )
        if not self.store.transition(
            self.task_id, Status.VERIFYING, expect={Status.RUNNING}, phase="verifying"
        ):
            raise _Superseded()
        self.emit("verification.started", {"commands": commands, "image": self._verify_image()})
        t0 = time.monotonic()
        outcome = run_verification(
            self.ctx,
            ws,
            snapshot,
            commands,
            self._verify_image(),
            self.limits,
            self.remaining(),
            self.redactor,
            self.emit,
            turn.number,
        )
        self.timings["verify_s"] = round(time.monotonic() - t0, 3)
        doc = outcome.document()
        self.emit("verification.completed", {"ok": outcome.ok})
        if outcome.timed_out:
            return _Outcome(
                Status.TIMED_OUT,
                self._timeout_error("verification was running"),
                {"verification": doc},
            )
        if not outcome.ok:
            bad = next(c for c in outcome.commands if c["exit_code"] != 0)
            return _Outcome(
                Status.FAILED,
                _error(
                    "verification_failed",
                    f"Verification command `{bad['command']}` exited with status "
                    f"{bad['exit_code']}.",
                ),
                {"verification": doc},
            )
        return _Outcome(Status.SUCCEEDED, fields={"verification": doc})

    def _timeout_error(self, phase: str) -> dict[str, str]:
        return _error(
            "timeout",
            f"The task passed its {self.limits['timeout_seconds']} s deadline while {phase} "
            "(limits.timeout_seconds); raise the limit or narrow the task.",
        )

    # -- the worker container -----------------------------------------------------------------

    def _run_worker(self, ws: TaskWorkspace, turn: Turn):
        worker = get_worker(self.ctx.config, self.spec.worker)
        launch = worker.launch(turn)
        for secret in launch.secrets:
            self.redactor.add_secret(secret)
        inputs = self.ctx.task_dir(self.task_id) / f"inputs-{turn.number}"
        inputs.mkdir(parents=True, exist_ok=True)
        inputs.chmod(0o755)
        for name, content in launch.files.items():
            (inputs / name).write_text(content, encoding="utf-8")
            (inputs / name).chmod(0o644)
        user, _ = self.ctx.sandbox_identity()
        mounts = [
            Mount(ws.worktree, "/workspace", read_only=self.spec.permission == "read_only"),
            Mount(ws.gitfile, "/workspace/.git", read_only=True),
            Mount(ws.private_gitdir, CONTAINER_GITDIR, read_only=False),
            Mount(ws.objects, CONTAINER_OBJECTS, read_only=True),
            Mount(inputs, INPUTS_DIR, read_only=True),
        ]
        env = {"HOME": "/home/worker", **launch.env}
        if self.ctx.config.extra_ca_file:
            mounts.append(Mount(self.ctx.config.extra_ca_file, "/etc/worker-bridge/extra-ca.pem"))
            env["NODE_EXTRA_CA_CERTS"] = "/etc/worker-bridge/extra-ca.pem"
        container_id = self.ctx.sandbox.start(
            ContainerSpec(
                image=worker.image(self.ctx.config),
                command=launch.command,
                user=user,
                labels=self.ctx.labels(self.task_id, "worker", turn=str(turn.number)),
                mounts=mounts,
                env=env,
                memory_mb=self.limits["memory_mb"],
                cpus=self.limits["cpus"],
                pids=self.limits["pids"],
                runtime=self.ctx.config.runtime,
            )
        )
        self.store.update_task(self.task_id, container_id=container_id)
        self.emit(
            "worker.started",
            {"container": container_id[:12], "turn": turn.number, "worker": worker.name},
        )
        reader = _OutputReader(self, worker, container_id)
        reader.start()
        exit_info = self.ctx.sandbox.wait(container_id, timeout=max(self.remaining(), 0.01))
        reader.join(timeout=30)
        self.emit(
            "worker.completed",
            {
                "exit_code": exit_info.exit_code,
                "oom_killed": exit_info.oom_killed,
                "timed_out": exit_info.timed_out,
            },
        )
        self.ctx.sandbox.remove(container_id)
        summary = reader.summary
        if summary is None:
            summary = reader.last_line
        summary = self.redactor.redact((summary or "")[: self.ctx.config.output_tail_chars])
        return exit_info, summary, reader.last_progress or ""

    def _collect(self, ws: TaskWorkspace):
        base = self.task["base_commit"]
        snapshot = snapshot_worktree(ws, base, f"worker-bridge snapshot of task {self.task_id}")
        changes = list_changes(ws.repository, base, snapshot)
        out = self.ctx.task_dir(self.task_id)
        out.mkdir(parents=True, exist_ok=True)
        diff_path, manifest_path = out / "changes.diff", out / "manifest.json"
        size, digest = write_diff(ws.repository, base, snapshot, diff_path)
        self.store.add_artifact(self.task_id, "diff", diff_path, size, digest)
        size, digest = write_manifest(changes, base, snapshot, manifest_path)
        self.store.add_artifact(self.task_id, "manifest", manifest_path, size, digest)
        return snapshot, changes

    def _cleanup_containers(self) -> None:
        try:
            self.ctx.sandbox.remove_by_labels({"io.worker-bridge.task": self.task_id})
        except BridgeError:
            pass

    def _finish(self, outcome: _Outcome) -> None:
        fields = dict(outcome.fields)
        fields["timings"] = self.timings
        fields["finished_at"] = now_iso()
        fields["phase"] = None
        fields["error"] = self.redactor.redact_data(outcome.error) if outcome.error else None
        event = {"error": fields["error"]} if outcome.error else {}
        self.store.transition(self.task_id, outcome.status, event=event, **fields)


class _Superseded(BridgeError):
    """The task left the status this runner expected (cancelled meanwhile)."""


class _OutputReader(threading.Thread):
    """Streams the worker's output into bounded, redacted `worker.progress` events."""

    def __init__(self, runner: TaskRunner, worker, container_id: str) -> None:
        super().__init__(name=f"output-{container_id[:12]}", daemon=True)
        self.runner = runner
        self.worker = worker
        self.container_id = container_id
        self.summary: str | None = None
        self.last_line: str | None = None  # raw, the summary of last resort
        self.last_progress: str | None = None  # parsed, for error messages
        self.count = 0

    def run(self) -> None:
        limit = self.runner.ctx.config.max_progress_events
        try:
            for line in self.runner.ctx.sandbox.stream_lines(self.container_id):
                if line.strip():
                    self.last_line = line
                parsed = self.worker.parse_line(line)
                if parsed.summary is not None:
                    self.summary = parsed.summary
                if parsed.progress is None:
                    continue
                if parsed.progress.strip():
                    self.last_progress = parsed.progress
                self.count += 1
                if self.count <= limit:
                    self.runner.emit("worker.progress", {"line": parsed.progress[:MAX_LINE]})
                elif self.count == limit + 1:
                    self.runner.emit(
                        "worker.progress",
                        {"line": f"[worker-bridge: output beyond {limit} lines is not recorded]"},
                    )
        except Exception as exc:  # a broken log stream must not break the run
            self.runner.emit("worker.progress", {"line": f"[output stream ended: {exc}]"})
