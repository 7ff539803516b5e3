"""Verification: a clean checkout of exactly the snapshot, checked in a fresh container from the
verification image with no network and no secrets. A worker can't mark its own homework."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.pipeline.context import Context
from bridge.redact import Redactor
from bridge.sandbox import ContainerSpec, Mount
from bridge.workspace.changes import Change, export_snapshot, update_checkout
from bridge.workspace.worktree import TaskWorkspace, chown_paths, chown_tree


@dataclass
class VerificationOutcome:
    ok: bool | None
    image: str
    commands: list[dict[str, Any]] = field(default_factory=list)
    timed_out: bool = False

    def document(self) -> dict[str, Any]:
        return {"ok": self.ok, "image": self.image, "commands": self.commands}


# Runs every command in order (all of them, even after a failure) as the container's own
# process, recording exit status, duration and output per command: one container start, no
# exec round-trips, and the container ends by itself.
DRIVER = r"""
in=/var/lib/worker-bridge/verify-in
out=/var/lib/worker-bridge/verify-out
now() {
  t=$(date +%s%N 2>/dev/null)
  case "$t" in *[!0-9]*|"") echo "$(date +%s)000000000" ;; *) echo "$t" ;; esac
}
i=0
while [ -f "$in/cmd.$i" ]; do
  start=$(now)
  (cd /workspace && exec sh -c "$(cat "$in/cmd.$i")") </dev/null >"$out/$i.out" 2>"$out/$i.err"
  code=$?
  echo "$code $(( $(now) - start ))" >"$out/$i.done"
  i=$((i + 1))
done
"""


def _tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - limit * 4))
            return fh.read().decode(errors="replace")[-limit:]
    except FileNotFoundError:
        return ""


class VerifyCheckout:
    """The clean checkout verification runs on, prepared off the critical path.

    While the worker runs, a thread checks out the *base* commit into a fresh folder; once the
    snapshot exists, only the paths the task changed are brought to the snapshot (deleted, or
    written by `git checkout-index` from an index of the snapshot). Without a prepared base (a
    resumed runner), `finish` makes a fresh checkout of the whole snapshot.
    """

    def __init__(self, ctx: Context, ws: TaskWorkspace, base: str, turn: int) -> None:
        self.ctx, self.ws, self.base = ctx, ws, base
        self.scratch = ctx.task_dir(ws.task_id) / f"verify-{turn}"
        self.path = self.scratch / "checkout"
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _chown(self, written: list[str] | None = None) -> None:
        """Hand the checkout (or only the paths just ``written`` into it) to the sandbox user."""
        _, owner = self.ctx.sandbox_identity()
        if owner is None:
            return
        if written is None:
            chown_tree(self.path, *owner)
        else:
            chown_paths(self.path, written, *owner)

    def _prepare(self) -> None:
        try:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch.mkdir(parents=True)
            export_snapshot(self.ws.repository, self.base, self.path, self.scratch)
            self._chown()
        except BaseException as exc:  # finish() falls back to a fresh checkout
            self._error = exc

    def start(self) -> VerifyCheckout:
        self._thread = threading.Thread(target=self._prepare, name="verify-checkout", daemon=True)
        self._thread.start()
        return self

    def finish(self, snapshot: str, changes: list[Change]) -> Path:
        """The folder, holding exactly ``snapshot`` (``changes``: base -> snapshot)."""
        if self._thread is not None:
            self._thread.join()
        if self._thread is None or self._error is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch.mkdir(parents=True)
            export_snapshot(self.ws.repository, snapshot, self.path, self.scratch)
            self._chown()
        else:  # the prepared base is already the sandbox user's: only new files need it
            written = update_checkout(
                self.ws.repository, self.path, snapshot, changes, self.scratch
            )
            self._chown(written)
        return self.path

    def discard(self) -> None:
        if self._thread is not None:
            self._thread.join()
        shutil.rmtree(self.scratch, ignore_errors=True)


def run_verification(
    ctx: Context,
    ws: TaskWorkspace,
    checkout: VerifyCheckout,
    snapshot: str,
    changes: list[Change],
    commands: list[str],
    image: str,
    limits: dict[str, Any],
    remaining: float,
    redactor: Redactor,
    emit: Callable[[str, dict[str, Any]], None],
    turn: int = 0,
) -> VerificationOutcome:
    """Run every command on the snapshot in one fresh container; record each outcome."""
    outcome = VerificationOutcome(ok=None, image=image)
    if not commands:
        return outcome
    user, owner = ctx.sandbox_identity()
    inputs, results = checkout.scratch / "in", checkout.scratch / "out"
    container_id = None
    try:
        path = checkout.finish(snapshot, changes)
        inputs.mkdir()
        results.mkdir()
        for i, command in enumerate(commands):
            (inputs / f"cmd.{i}").write_text(command)
        for entry in (checkout.scratch, inputs, *inputs.iterdir()):
            entry.chmod(0o755 if entry.is_dir() else 0o644)
        if owner is not None:
            os.chown(results, *owner)
        ctx.store.update_task(ws.task_id, container_id="starting")
        container_id = ctx.sandbox.start(
            ContainerSpec(
                image=image,
                command=["sh", "-c", DRIVER],
                user=user,
                labels=ctx.labels(ws.task_id, "verify", turn=str(turn)),
                mounts=[
                    Mount(path, "/workspace", read_only=False),
                    Mount(inputs, "/var/lib/worker-bridge/verify-in", read_only=True),
                    Mount(results, "/var/lib/worker-bridge/verify-out", read_only=False),
                ],
                env={"HOME": "/home/worker"},
                memory_mb=limits["memory_mb"],
                cpus=limits["cpus"],
                pids=limits["pids"],
                runtime=ctx.config.runtime,
            )
        )
        ctx.store.update_task(ws.task_id, container_id=container_id)
        exit_info = ctx.sandbox.wait(container_id, timeout=max(remaining, 0.01))
        outcome.timed_out = exit_info.timed_out
        tail = ctx.config.output_tail_chars
        for i, command in enumerate(commands):
            done = _tail(results / f"{i}.done", 100).split()
            record = {
                "command": redactor.redact(command),
                "exit_code": int(done[0]) if done else None,
                "duration_s": round(int(done[1]) / 1e9, 3) if len(done) > 1 else None,
                "stdout_tail": redactor.redact(_tail(results / f"{i}.out", tail)),
                "stderr_tail": redactor.redact(_tail(results / f"{i}.err", tail)),
            }
            if not done and exit_info.oom_killed:
                record["stderr_tail"] += "\n[worker-bridge: killed, out of memory]"
            outcome.commands.append(record)
            emit("verification.command", record)
        outcome.ok = not outcome.timed_out and all(c["exit_code"] == 0 for c in outcome.commands)
        return outcome
    finally:
        if container_id:
            ctx.sandbox.remove(container_id)
        ctx.store.update_task(ws.task_id, container_id=None)
        checkout.discard()
