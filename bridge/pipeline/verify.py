"""Verification: a clean checkout of exactly the snapshot, checked by the user's commands in fresh
containers from the verification image, with no network and no secrets.

A worker can't mark its own homework, and the code under verification is the worker's code, so
nothing it can touch records a result: each command runs as the whole of its own container, and
its exit status, duration and output are the engine's record of that container (read through
the engine's API, bounded), never files the command could rewrite, link or block. Background
processes and killed siblings die with their container; a command that did not run is reported
as not run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.documents import EnvironmentDoc
from bridge.environments.task import add_cached_files
from bridge.phase.handle import PhaseHandle
from bridge.phase.run_container import Reader, run_container
from bridge.phase.specs import task_container
from bridge.phase.watch import DiskWatch
from bridge.pipeline.checkout import VerifyCheckout
from bridge.records import CommandResult, VerificationDoc
from bridge.sandbox import ExitInfo, Mount
from bridge.sandbox.output import Tail
from bridge.workspace.diff import Change, export_snapshot
from bridge.workspace.trash import discard
from bridge.workspace.worktree import chown_tree

if TYPE_CHECKING:
    from bridge.environments.task import Ready

PYTHON_HOOK = Path(__file__).resolve().parents[1] / "sandbox" / "python"
CONTAINER_PYTHON_HOOK = "/var/lib/worker-bridge/python"


def python_hook(home: Path) -> Path:
    """The hook's folder under the state root, which is what verification containers mount:
    the engine resolves a bind mount's source on its own host, where the installed package's
    path need not exist (a bridge in its own container shares only the state root). Written
    atomically, and only when its content changed, so concurrent runners never see half a file."""
    folder = home / "python"
    target = folder / "sitecustomize.py"
    data = (PYTHON_HOOK / "sitecustomize.py").read_bytes()
    try:
        if target.read_bytes() == data:
            return folder
    except OSError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)  # read by the sandbox uid whatever the umask
    partial = folder / f".sitecustomize.py.{os.getpid()}.{threading.get_ident()}"
    partial.write_bytes(data)
    partial.chmod(0o644)
    os.replace(partial, target)
    return folder


@dataclass
class VerificationOutcome:
    ok: bool | None
    image: str
    commands: list[CommandResult] = field(default_factory=list)
    timed_out: bool = False
    environment: EnvironmentDoc | None = None

    def document(self) -> VerificationDoc:
        return VerificationDoc(
            ok=self.ok, image=self.image, commands=self.commands, environment=self.environment
        )

    @property
    def first_failure(self) -> CommandResult | None:
        return next((c for c in self.commands if not c.passed), None)


def run_verification(
    handle: PhaseHandle,
    checkout: VerifyCheckout,
    snapshot: str,
    changes: list[Change],
    commands: list[str],
    image: str,
    turn: int,
    env: Ready | None = None,
) -> VerificationOutcome:
    """Bring the checkout to the snapshot, run the commands (the first on it, each later one
    on a fresh checkout of the snapshot), and remove them. With an environment, each checkout
    also gets the setup's cached files, and the commands run in its image."""
    if not commands:
        return VerificationOutcome(ok=None, image=image)
    try:
        checkout.outputs = env.outputs if env is not None else None
        checkout.sealed = env.sealed if env is not None else None
        checkout.finish(snapshot, changes)
        fresh = FreshCheckouts(handle, snapshot, checkout.scratch, first=checkout.path, env=env)
        return run_commands(handle, fresh, commands, image, str(turn))
    finally:
        checkout.discard()


class FreshCheckouts:
    """A clean checkout of the tree for each command, so nothing one command's code does to
    its files (rewriting a protected test, planting a conftest.py) is seen by the next one.
    Command N+1's checkout is written while command N runs."""

    def __init__(
        self,
        handle: PhaseHandle,
        tree: str,
        scratch: Path,
        first: Path | None = None,
        env: Ready | None = None,
    ) -> None:
        self.handle, self.tree, self.scratch, self.first = handle, tree, scratch, first
        self.env = env
        self._ready: dict[int, threading.Thread] = {}
        self._errors: dict[int, BaseException] = {}

    def path(self, index: int) -> Path:
        if index == 0 and self.first is not None:
            return self.first
        return self.scratch / f"checkout-{index}"

    def _make(self, index: int) -> None:
        try:
            dest = self.path(index)
            discard(self.handle.ctx.home, dest)
            repo = Path(self.handle.record.repository)
            export_snapshot(self.handle.ctx.home, repo, self.tree, dest, self.scratch)
            _, owner = self.handle.ctx.sandbox_identity()
            if owner is not None:
                chown_tree(dest, *owner)
            if self.env is not None and self.env.outputs is not None:  # after the chown
                add_cached_files(self.handle, self.env.outputs, self.env.sealed, dest)
        except BaseException as exc:  # raised in the caller's thread by get()
            self._errors[index] = exc

    def prepare(self, index: int) -> None:
        """Start writing checkout ``index`` in the background."""
        if index in self._ready or (index == 0 and self.first is not None):
            return
        thread = threading.Thread(target=self._make, args=(index,), daemon=True)
        self._ready[index] = thread
        thread.start()

    def get(self, index: int) -> Path:
        self.prepare(index)
        if index in self._ready:
            self._ready[index].join()
        if index in self._errors:
            raise self._errors[index]
        return self.path(index)

    def done(self, index: int) -> None:
        """Command ``index`` ended: its checkout goes to the trash (removed in the background)."""
        if index != 0 or self.first is None:
            discard(self.handle.ctx.home, self.path(index))

    def close(self) -> None:
        for index, thread in self._ready.items():
            thread.join()
            self.done(index)


def run_commands(
    handle: PhaseHandle,
    checkouts: FreshCheckouts,
    commands: list[str],
    image: str,
    label: str,
) -> VerificationOutcome:
    """Run every command (all of them, in order, even after a failure), each in a fresh
    container on a fresh checkout; ``label`` tells the containers of one round apart (a turn,
    accept)."""
    outcome = VerificationOutcome(ok=None, image=image)
    try:
        for index, command in enumerate(commands):
            if outcome.timed_out or handle.remaining() <= 0:
                outcome.timed_out = True
                result = CommandResult(command=handle.redactor.redact(command), status="not_run")
            else:
                workspace = checkouts.get(index)
                if index + 1 < len(commands):
                    checkouts.prepare(index + 1)
                result = _run_command(
                    handle, workspace, command, image, label, index, checkouts.env
                )
                checkouts.done(index)
                outcome.timed_out = result.status == "timed_out"
            outcome.commands.append(result)
            handle.emit("verification.command", result.model_dump())
    finally:
        checkouts.close()
    outcome.ok = not outcome.timed_out and all(c.passed for c in outcome.commands)
    return outcome


def _run_command(
    handle: PhaseHandle,
    workspace: Path,
    command: str,
    image: str,
    label: str,
    index: int,
    env: Ready | None = None,
) -> CommandResult:
    ctx = handle.ctx
    user, _ = ctx.sandbox_identity()
    tail_bytes = ctx.config.output_tail_chars * 4
    out, err = Tail(tail_bytes), Tail(tail_bytes)
    spec = task_container(
        handle,
        "verify",
        image,
        ["sh", "-c", command],
        user=user,
        labels={"turn": label, "command": str(index)},
        mounts=[
            Mount(workspace, "/workspace", read_only=False),
            Mount(python_hook(ctx.home), CONTAINER_PYTHON_HOOK, read_only=True),
        ],
        env={
            # A project's environment: its variables, its own PATH (no worker CLI on it).
            **(env.verify_env if env is not None else {}),
            "HOME": "/home/worker",
            # The repository's files never shadow an installed module (see sitecustomize.py).
            "PYTHONSAFEPATH": "1",
            "PYTHONNOUSERSITE": "1",
            "PYTHONPATH": CONTAINER_PYTHON_HOOK,
            "PYTHONDONTWRITEBYTECODE": "1",
        },
        own_image=env is not None,
        tmpfs=("/tmp", "/home/worker"),
    )
    watch = DiskWatch(handle)
    run = run_container(
        handle, spec, readers=[_tail_reader(out, True), _tail_reader(err, False)], watchdog=watch
    )
    result = _command_result(handle, command, run.exit, out, err)
    note = watch.message(f"Verification command `{result.command}`")
    if note is not None:
        result.status, result.note = "over_limit", handle.redactor.redact(note)
    return result


def _tail_reader(tail: Tail, stdout: bool) -> Reader:
    def consume(chunks: Iterator[bytes]) -> None:
        for chunk in chunks:
            tail.feed(chunk)

    return Reader(consume, stdout=stdout, stderr=not stdout)


def _command_result(
    handle: PhaseHandle, command: str, info: ExitInfo, out: Tail, err: Tail
) -> CommandResult:
    chars = handle.ctx.config.output_tail_chars
    redact = handle.redactor.redact
    # Redacted whole, then cut: a secret across the cut would otherwise show one of its ends.
    stdout, stderr = redact(out.text())[-chars:], redact(err.text())[-chars:]
    if info.timed_out:
        status, code = "timed_out", None
    elif info.exit_code is None:
        status, code = "not_run", None  # removed before it ended (a cancel)
    elif info.oom_killed:
        status, code = "out_of_memory", info.exit_code
        stderr += "\n[worker-bridge: killed, out of memory]"
    else:
        status, code = ("passed" if info.exit_code == 0 else "failed"), info.exit_code
    return CommandResult(
        command=redact(command),
        exit_code=code,
        duration_s=info.duration_s,
        stdout_tail=stdout,
        stderr_tail=stderr,
        status=status,
    )
