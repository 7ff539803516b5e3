"""The worker phase of one turn: the worker's container (started, or adopted from a runner that
died), its output streamed into bounded, redacted `worker.progress` events, and how it exited,
recorded before the container is removed (so a crash loses nothing)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from bridge.asking import MAX_FINAL_MESSAGE, parse_request_block
from bridge.documents import WorkerExit
from bridge.environments.task import BUNDLE
from bridge.errors import BridgeError, InvalidSpec
from bridge.phase.handle import PhaseHandle
from bridge.phase.network import GatewayOpener, task_gateway, with_gateway
from bridge.phase.run_container import Reader, run_container
from bridge.phase.specs import task_container
from bridge.phase.watch import DiskWatch
from bridge.sandbox import ContainerSpec, ExitInfo, Mount
from bridge.sandbox.output import bounded_lines
from bridge.workers import HOME_DIR, INPUTS_DIR, Turn, Worker
from bridge.workers.base import Progress
from bridge.workspace.objects import base_stores, container_alternates
from bridge.workspace.worktree import CONTAINER_GITDIR, TaskWorkspace

if TYPE_CHECKING:
    from bridge.environments.task import Ready

MAX_LINE = 2000  # characters of one progress event's text
SETTLE_LINES = 200  # the last lines of a worker's output read again once it exited


def run_worker_turn(
    handle: PhaseHandle,
    ws: TaskWorkspace,
    worker: Worker,
    turn: Turn,
    *,
    resume: bool,
    env: Ready | None = None,
    gateway: GatewayOpener = task_gateway,
) -> WorkerExit:
    """Run (or, when resuming, adopt or skip) the worker container of ``turn`` (in the
    project's environment when ``env`` is given). ``gateway`` opens the turn's way out: the
    task's gateway on this host, or on a node the relay to the control host's."""
    recorded = handle.record.worker_exit
    if resume and recorded is not None and recorded.turn == turn.number:
        return recorded
    if turn.number > 0 and worker.resumes_sessions and not turn.session_id:
        raise BridgeError(
            f"Turn {turn.number} cannot resume {worker.name}'s session: the earlier turn recorded "
            "none (the CLI failed before it started one); delegate a new task instead.",
            kind="worker_exit",
        )
    spec = _container_spec(handle, ws, worker, turn, env)
    reader = _ProgressReader(handle, worker)
    container: list[str] = []

    def started(container_id: str, adopted: bool) -> None:
        container.append(container_id)
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
        # The live stream can end early (the engine's log rotation under a fast writer): the
        # worker's last lines, its result line among them, are read again from the kept log.
        reader.settle(handle.ctx.sandbox.output(container[0], tail=SETTLE_LINES))
        summary = next(
            (s for s in (reader.summary, reader.failure, reader.last_message) if s is not None),
            reader.last_line or "",  # a plain CLI's last line is its final word
        )
        # Redacted whole, then cut (a secret across the cut would show one of its ends); the
        # request block is read from the whole final message (its end, bounded), not the cut.
        final = handle.redactor.redact(summary)
        done = WorkerExit(
            turn=turn.number,
            exit_code=info.exit_code,
            oom_killed=info.oom_killed,
            timed_out=info.timed_out,
            summary=final[: handle.ctx.config.output_tail_chars],
            request=parse_request_block(final[-MAX_FINAL_MESSAGE:]),
            last_progress=handle.redactor.redact(reader.last_progress or "")[:300],
            over_limit=over,
            failure=handle.redactor.redact(reader.failure)[:500] if reader.failure else None,
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

    routes = worker.routes(turn.metadata, handle.ctx.config)
    with gateway(handle, routes, turn.number) as port:
        run_container(
            handle,
            with_gateway(spec, handle, port),
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
    handle: PhaseHandle, ws: TaskWorkspace, worker: Worker, turn: Turn, env: Ready | None
) -> ContainerSpec:
    ctx = handle.ctx
    launch = worker.launch(turn, ctx.config)
    for secret in launch.secrets:
        handle.redactor.add_secret(secret)
    inputs = ctx.task_dir(handle.task_id) / f"inputs-{turn.number}"
    inputs.mkdir(parents=True, exist_ok=True)
    inputs.chmod(0o755)
    for name, content in launch.files.items():
        (inputs / name).write_text(content, encoding="utf-8")
        (inputs / name).chmod(0o644)
    user, owner = ctx.sandbox_identity()
    home = cli_home(ctx.task_dir(handle.task_id), owner)
    # The objects reachable from the base commit, and nothing else of the user's store.
    stores = base_stores(ctx.home, ws.repository, handle.record.base_commit or "")
    mounts = [
        Mount(ws.worktree, "/workspace", read_only=turn.read_only),
        Mount(ws.gitfile, "/workspace/.git", read_only=True),
        Mount(ws.private_gitdir, CONTAINER_GITDIR, read_only=turn.read_only),
        *(
            Mount(store, target, read_only=True)
            for store, target in zip(stores, container_alternates(len(stores)), strict=True)
        ),
        Mount(inputs, INPUTS_DIR, read_only=True),
        Mount(home, HOME_DIR, read_only=False),
        *_home_files(inputs, home, launch.home_files, owner),
    ]
    variables = {**(env.worker_env if env is not None else {}), "HOME": HOME_DIR, **launch.env}
    if env is not None:  # the worker image's bundle: its CLI and the relay, read-only
        mounts.append(Mount(env.bundle, BUNDLE, read_only=True))
    return task_container(
        handle,
        "worker",
        env.image if env is not None else worker.image(ctx.config),
        launch.command,
        user=user,
        mounts=mounts,
        env=variables,
        own_image=env is not None,
        labels={"turn": str(turn.number)},
        extra_ca=True,
    )


def cli_home(task_dir: Path, owner: tuple[int, int] | None) -> Path:
    """The task's CLI home (sessions, caches): made once, owned by the sandbox identity, kept
    across the task's turns and removed with the task's folder by prune. The host never looks
    inside it but to remove it."""
    home = task_dir / "home"
    try:
        home.mkdir(mode=0o700)
    except FileExistsError:
        return home
    if owner is not None:
        os.chown(home, *owner)
    return home


def _home_files(
    inputs: Path, home: Path, files: dict[str, str], owner: tuple[int, int] | None
) -> list[Mount]:
    """The worker's config files, written into the host's own inputs folder and mounted
    read-only at their place in the home (the host never writes into the worker's home: a
    link planted there by an earlier turn would lead it elsewhere). Missing folders on the way
    are made inside the home without following links, owned by the sandbox identity."""
    mounts = []
    for rel, content in sorted(files.items()):
        parts = PurePosixPath(rel).parts
        if not parts or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise InvalidSpec(f"Worker home file '{rel}' must be a relative path inside the home.")
        source = inputs / "home" / "-".join(parts)
        source.parent.mkdir(exist_ok=True)
        source.write_text(content, encoding="utf-8")
        source.chmod(0o644)
        _make_dirs(home, parts[:-1], owner, parts[-1])
        mounts.append(Mount(source, f"{HOME_DIR}/{rel}", read_only=True))
    return mounts


def _make_dirs(
    home: Path, parts: tuple[str, ...], owner: tuple[int, int] | None, leaf: str
) -> None:
    """Make ``parts`` inside ``home`` (no link followed), and clear the way for the mount of
    ``leaf`` in the last: a link an earlier turn planted there is removed (the engine would
    follow it), anything else but a file is refused."""
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise BridgeError(
                    f"The worker's home holds '{part}' where the CLI's config folder belongs, and "
                    "it is not a folder; delegate a new task.",
                    kind="worker_exit",
                ) from exc
            os.close(fd)
            fd = child
        try:
            st = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            os.unlink(leaf, dir_fd=fd)
        elif not stat.S_ISREG(st.st_mode):
            raise BridgeError(
                f"The worker's home holds '{leaf}' where the CLI's config file belongs, and it "
                "is not a file; delegate a new task.",
                kind="worker_exit",
            )
    finally:
        os.close(fd)


class _ProgressReader:
    """Turns the worker's output into bounded, redacted `worker.progress` events, and keeps
    its summary, its session id (recorded as soon as seen) and its own account of a failure."""

    def __init__(self, handle: PhaseHandle, worker: Worker) -> None:
        self.handle = handle
        self.worker = worker
        self.summary: str | None = None
        self.failure: str | None = None
        self.session_id = handle.record.session_id
        self.last_line: str | None = None  # raw, the summary of last resort
        self.last_progress: str | None = None  # parsed, for error messages
        self.last_message: str | None = None  # the last thing the worker said
        self.bad_session_noted = False
        self.count = handle.ctx.store.count_events(handle.task_id, "worker.progress")
        self.skip = 0  # progress events at the start already recorded (an adopted container)

    def consume(self, chunks: Iterator[bytes]) -> None:
        try:
            for line in bounded_lines(chunks, self.handle.limits.line_kb * 1024):
                self._take(line, record=True)
        except Exception as exc:  # a broken log stream must not break the run
            self._emit(Progress("error", f"[output stream ended: {exc}]"), always=True)

    def settle(self, tail: Iterator[bytes]) -> None:
        """Take the worker's last lines from the engine's kept log once it exited: when the live
        stream ended before them, its summary, failure and session come from there (parsed
        again: the last one seen wins), with a note that the live view missed lines."""
        try:
            lines = list(bounded_lines(tail, self.handle.limits.line_kb * 1024))
        except Exception:  # noqa: BLE001 - no kept log: what the stream gave stands
            return
        kept = [line for line in lines if line.strip()]
        if not kept or kept[-1] == self.last_line:
            return  # the stream saw the end
        note = "[worker-bridge: the live output ended early; the last lines come from the "
        self._emit(Progress("error", note + "engine's kept log]"), always=True)
        for line in kept:
            self._take(line, record=False)

    def _take(self, line: str, *, record: bool) -> None:
        """One line of the worker's output: its summary, failure and session kept, its progress
        recorded as events (``record``) or only remembered."""
        if line.strip():
            self.last_line = line
        parsed = self.worker.parse_line(line)
        if parsed.summary is not None:
            self.summary = parsed.summary
        if parsed.failure is not None:
            self.failure = parsed.failure
        if parsed.session_id and parsed.session_id != self.session_id:
            self._session(parsed.session_id)
        for progress in parsed.progress:
            if record:
                self._emit(progress)
            else:
                self._remember(progress)

    def _remember(self, progress: Progress) -> None:
        if progress.text.strip():
            self.last_progress = progress.text
            if progress.kind == "message":
                self.last_message = progress.text

    def _session(self, session_id: str) -> None:
        """Record the CLI's session id, if it has the CLI's own shape (see session_ok)."""
        if self.worker.session_ok(session_id):
            self.session_id = session_id
            self.handle.update(session_id=session_id)
        elif not self.bad_session_noted:
            self.bad_session_noted = True
            self._emit(
                Progress("error", "[worker-bridge: a session id of unexpected shape was ignored]")
            )

    def _emit(self, progress: Progress, always: bool = False) -> None:
        self._remember(progress)
        if self.skip > 0 and not always:
            self.skip -= 1
            return
        limit = self.handle.ctx.config.max_progress_events
        self.count += 1
        if self.count > limit + 1 and not always:
            return
        if self.count == limit + 1 and not always:
            note = f"[worker-bridge: output beyond {limit} events is not recorded]"
            progress = Progress("message", note)
        # Redacted whole, then cut (a secret across the cut would show one of its ends).
        redact = self.handle.redactor.redact
        data = progress.document()
        data["text"] = clip(redact(progress.text))
        if data["name"] is not None:
            data["name"] = clip(redact(str(data["name"])), 200)
        self.handle.emit("worker.progress", data)
