"""The worker phase of one turn: the worker's container (started, or adopted from a runner that
died), its output streamed into bounded, redacted `worker.progress` events, and how it exited,
recorded before the container is removed (so a crash loses nothing)."""

from __future__ import annotations

from collections.abc import Iterator

from bridge.pipeline.containers import Reader, run_container
from bridge.pipeline.handle import PhaseHandle
from bridge.pipeline.network import task_gateway, with_gateway
from bridge.pipeline.watch import DiskWatch
from bridge.records import WorkerExit
from bridge.sandbox import ContainerSpec, ExitInfo, Mount
from bridge.sandbox.output import bounded_lines
from bridge.workers import INPUTS_DIR, Turn, Worker
from bridge.workspace.objects import base_stores, container_alternates
from bridge.workspace.worktree import CONTAINER_GITDIR, TaskWorkspace

MAX_LINE = 2000  # characters of one progress event's text


def run_worker_turn(
    handle: PhaseHandle, ws: TaskWorkspace, worker: Worker, turn: Turn, *, resume: bool
) -> WorkerExit:
    """Run (or, when resuming, adopt or skip) the worker container of ``turn``."""
    recorded = handle.record.worker_exit
    if resume and recorded is not None and recorded.turn == turn.number:
        return recorded
    spec = _container_spec(handle, ws, worker, turn)
    reader = _ProgressReader(handle, worker)

    def started(container_id: str, adopted: bool) -> None:
        if adopted:  # what the dead runner already recorded of this turn is not recorded twice
            store = handle.ctx.store
            since = store.last_event_id(handle.task_id, "worker.started")
            reader.skip = store.count_events(handle.task_id, "worker.progress", after=since)
            handle.emit("worker.adopted", {"container": container_id[:12], "turn": turn.number})
        else:
            handle.emit(
                "worker.started",
                {"container": container_id[:12], "turn": turn.number, "worker": worker.name},
            )

    result: list[WorkerExit] = []
    watch = DiskWatch(handle)

    def exited(info: ExitInfo) -> None:
        over = watch.message("The worker")
        summary = reader.summary if reader.summary is not None else (reader.last_line or "")
        done = WorkerExit(
            turn=turn.number,
            exit_code=info.exit_code,
            oom_killed=info.oom_killed,
            timed_out=info.timed_out,
            # Redacted whole, then cut (a secret across the cut would show one of its ends).
            summary=handle.redactor.redact(summary)[: handle.ctx.config.output_tail_chars],
            last_progress=handle.redactor.redact(reader.last_progress or "")[:300],
            over_limit=over,
        )
        handle.update(worker_exit=done)
        handle.emit(
            "worker.completed",
            {
                "exit_code": info.exit_code,
                "oom_killed": info.oom_killed,
                "timed_out": info.timed_out,
            },
        )
        result.append(done)

    with task_gateway(handle, worker.routes(turn.metadata)) as gateway:
        run_container(
            handle,
            with_gateway(spec, handle, gateway),
            readers=[Reader(reader.consume)],
            adopt=resume,
            on_start=started,
            on_exit=exited,
            watchdog=watch,
        )
    return result[0]


def clip(text: str, limit: int = MAX_LINE) -> str:
    """``text`` within ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    note = f" [worker-bridge: line cut, {len(text) - limit} more characters]"
    return text[: max(limit - len(note), 0)] + note


def _container_spec(
    handle: PhaseHandle, ws: TaskWorkspace, worker: Worker, turn: Turn
) -> ContainerSpec:
    ctx, limits = handle.ctx, handle.limits
    launch = worker.launch(turn)
    for secret in launch.secrets:
        handle.redactor.add_secret(secret)
    inputs = ctx.task_dir(handle.task_id) / f"inputs-{turn.number}"
    inputs.mkdir(parents=True, exist_ok=True)
    inputs.chmod(0o755)
    for name, content in launch.files.items():
        (inputs / name).write_text(content, encoding="utf-8")
        (inputs / name).chmod(0o644)
    user, _ = ctx.sandbox_identity()
    # The objects reachable from the base commit, and nothing else of the user's store.
    stores = base_stores(ctx.home, ws.repository, handle.record.base_commit or "")
    mounts = [
        Mount(ws.worktree, "/workspace", read_only=handle.spec.permission == "read_only"),
        Mount(ws.gitfile, "/workspace/.git", read_only=True),
        Mount(ws.private_gitdir, CONTAINER_GITDIR, read_only=False),
        *(
            Mount(store, target, read_only=True)
            for store, target in zip(stores, container_alternates(len(stores)), strict=True)
        ),
        Mount(inputs, INPUTS_DIR, read_only=True),
    ]
    env = {"HOME": "/home/worker", **launch.env}
    if ctx.config.extra_ca_file:
        mounts.append(Mount(ctx.config.extra_ca_file, "/etc/worker-bridge/extra-ca.pem"))
        env["NODE_EXTRA_CA_CERTS"] = "/etc/worker-bridge/extra-ca.pem"
    return ContainerSpec(
        image=worker.image(ctx.config),
        command=launch.command,
        user=user,
        labels=ctx.labels(handle.task_id, "worker", turn=str(turn.number)),
        mounts=mounts,
        env=env,
        memory_mb=limits.memory_mb,
        cpus=limits.cpus,
        pids=limits.pids,
        runtime=ctx.config.runtime,
        log_max_mb=limits.log_mb,
    )


class _ProgressReader:
    """Turns the worker's output into bounded, redacted `worker.progress` events."""

    def __init__(self, handle: PhaseHandle, worker: Worker) -> None:
        self.handle = handle
        self.worker = worker
        self.summary: str | None = None
        self.last_line: str | None = None  # raw, the summary of last resort
        self.last_progress: str | None = None  # parsed, for error messages
        self.count = handle.ctx.store.count_events(handle.task_id, "worker.progress")
        self.skip = 0  # progress lines at the start already recorded (an adopted container)

    def consume(self, chunks: Iterator[bytes]) -> None:
        limit = self.handle.ctx.config.max_progress_events
        try:
            for line in bounded_lines(chunks, self.handle.limits.line_kb * 1024):
                if line.strip():
                    self.last_line = line
                parsed = self.worker.parse_line(line)
                if parsed.summary is not None:
                    self.summary = parsed.summary
                if parsed.progress is None:
                    continue
                if parsed.progress.strip():
                    self.last_progress = parsed.progress
                if self.skip > 0:
                    self.skip -= 1
                    continue
                self.count += 1
                if self.count <= limit:
                    self.handle.emit("worker.progress", {"line": clip(parsed.progress)})
                elif self.count == limit + 1:
                    self.handle.emit(
                        "worker.progress",
                        {"line": f"[worker-bridge: output beyond {limit} lines is not recorded]"},
                    )
        except Exception as exc:  # a broken log stream must not break the run
            self.handle.emit("worker.progress", {"line": f"[output stream ended: {exc}]"})
