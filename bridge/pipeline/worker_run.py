"""The worker container of one turn: start it (or adopt one a dead runner left running), stream
its output into bounded, redacted `worker.progress` events, wait for it against the deadline,
and record how it exited before the container is removed (so a crash loses nothing)."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from bridge.sandbox import ContainerSpec, Mount
from bridge.workers import INPUTS_DIR, Turn, Worker
from bridge.workspace.worktree import CONTAINER_GITDIR, CONTAINER_OBJECTS, TaskWorkspace

if TYPE_CHECKING:
    from bridge.pipeline.runner import TaskRunner

MAX_LINE = 2000


@dataclass
class WorkerExit:
    """How a worker turn ended; persisted on the task as `worker_exit`."""

    turn: int
    exit_code: int | None
    oom_killed: bool = False
    timed_out: bool = False
    summary: str = ""
    last_progress: str = ""

    def document(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_document(cls, doc: dict[str, Any] | None, turn: int) -> WorkerExit | None:
        if not doc or doc.get("turn") != turn:
            return None
        return cls(**doc)


def run_worker_turn(
    runner: TaskRunner, ws: TaskWorkspace, turn: Turn, *, resume: bool
) -> WorkerExit:
    """Run (or, when resuming, adopt or skip) the worker container of ``turn``."""
    ctx = runner.ctx
    if resume:
        recorded = WorkerExit.from_document(
            runner.store.get_task(runner.task_id).get("worker_exit"), turn.number
        )
        if recorded is not None:
            return recorded
    worker = runner.worker
    labels = ctx.labels(runner.task_id, "worker", turn=str(turn.number))
    existing = ctx.sandbox.containers(labels) if resume else []
    if existing and existing[0]["status"] in ("running", "exited", "dead"):
        container_id = existing[0]["id"]
        since = time.time()
        runner.emit("worker.adopted", {"container": container_id[:12], "turn": turn.number})
    else:
        for item in existing:
            ctx.sandbox.remove(item["id"])
        container_id = _start(runner, ws, turn, worker, labels)
        since = None
    runner.ensure_active(kill=container_id)
    reader = _OutputReader(runner, worker, container_id, since)
    reader.start()
    info = ctx.sandbox.wait(container_id, timeout=max(runner.remaining(), 0.01))
    reader.join(timeout=30)
    summary = reader.summary if reader.summary is not None else (reader.last_line or "")
    result = WorkerExit(
        turn=turn.number,
        exit_code=info.exit_code,
        oom_killed=info.oom_killed,
        timed_out=info.timed_out,
        summary=runner.redactor.redact(summary[: ctx.config.output_tail_chars]),
        last_progress=runner.redactor.redact((reader.last_progress or "")[:300]),
    )
    runner.store.update_task(runner.task_id, worker_exit=result.document())
    runner.emit(
        "worker.completed",
        {"exit_code": info.exit_code, "oom_killed": info.oom_killed, "timed_out": info.timed_out},
    )
    ctx.sandbox.remove(container_id)
    runner.store.update_task(runner.task_id, container_id=None)
    return result


def _start(
    runner: TaskRunner, ws: TaskWorkspace, turn: Turn, worker: Worker, labels: dict[str, str]
) -> str:
    ctx = runner.ctx
    launch = worker.launch(turn)
    for secret in launch.secrets:
        runner.redactor.add_secret(secret)
    inputs = ctx.task_dir(runner.task_id) / f"inputs-{turn.number}"
    inputs.mkdir(parents=True, exist_ok=True)
    inputs.chmod(0o755)
    for name, content in launch.files.items():
        (inputs / name).write_text(content, encoding="utf-8")
        (inputs / name).chmod(0o644)
    user, _ = ctx.sandbox_identity()
    mounts = [
        Mount(ws.worktree, "/workspace", read_only=runner.spec.permission == "read_only"),
        Mount(ws.gitfile, "/workspace/.git", read_only=True),
        Mount(ws.private_gitdir, CONTAINER_GITDIR, read_only=False),
        Mount(ws.objects, CONTAINER_OBJECTS, read_only=True),
        Mount(inputs, INPUTS_DIR, read_only=True),
    ]
    env = {"HOME": "/home/worker", **launch.env}
    if ctx.config.extra_ca_file:
        mounts.append(Mount(ctx.config.extra_ca_file, "/etc/worker-bridge/extra-ca.pem"))
        env["NODE_EXTRA_CA_CERTS"] = "/etc/worker-bridge/extra-ca.pem"
    limits = runner.limits
    # Recorded before the start: while set, a dead runner's lease keeps counting (see leases).
    runner.store.update_task(runner.task_id, container_id="starting")
    container_id = ctx.sandbox.start(
        ContainerSpec(
            image=worker.image(ctx.config),
            command=launch.command,
            user=user,
            labels=labels,
            mounts=mounts,
            env=env,
            memory_mb=limits["memory_mb"],
            cpus=limits["cpus"],
            pids=limits["pids"],
            runtime=ctx.config.runtime,
        )
    )
    runner.store.update_task(runner.task_id, container_id=container_id)
    runner.emit(
        "worker.started",
        {"container": container_id[:12], "turn": turn.number, "worker": worker.name},
    )
    return container_id


class _OutputReader(threading.Thread):
    """Streams the worker's output into bounded, redacted `worker.progress` events."""

    def __init__(
        self, runner: TaskRunner, worker: Worker, container_id: str, since: float | None
    ) -> None:
        super().__init__(name=f"output-{container_id[:12]}", daemon=True)
        self.runner = runner
        self.worker = worker
        self.container_id = container_id
        self.since = since
        self.summary: str | None = None
        self.last_line: str | None = None  # raw, the summary of last resort
        self.last_progress: str | None = None  # parsed, for error messages
        self.count = runner.store.count_events(runner.task_id, "worker.progress")

    def run(self) -> None:
        limit = self.runner.ctx.config.max_progress_events
        try:
            for line in self.runner.ctx.sandbox.stream_lines(self.container_id, since=self.since):
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
