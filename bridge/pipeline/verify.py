"""Verification: a clean checkout of exactly the snapshot, checked in a fresh container from the
verification image with no network and no secrets. A worker can't mark its own homework."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.pipeline.context import Context
from bridge.redact import Redactor
from bridge.sandbox import ContainerSpec, Mount
from bridge.workspace.changes import export_snapshot
from bridge.workspace.worktree import TaskWorkspace, chown_tree


@dataclass
class VerificationOutcome:
    ok: bool | None
    image: str
    commands: list[dict[str, Any]] = field(default_factory=list)
    timed_out: bool = False

    def document(self) -> dict[str, Any]:
        return {"ok": self.ok, "image": self.image, "commands": self.commands}


def run_verification(
    ctx: Context,
    ws: TaskWorkspace,
    snapshot: str,
    commands: list[str],
    image: str,
    limits: dict[str, Any],
    remaining: float,
    redactor: Redactor,
    emit: Callable[[str, dict[str, Any]], None],
    turn: int = 0,
    should_stop: Callable[[], bool] = lambda: False,
) -> VerificationOutcome:
    """Run every command (all of them, even after a failure) and record each one's outcome."""
    outcome = VerificationOutcome(ok=None, image=image)
    if not commands:
        return outcome
    user, owner = ctx.sandbox_identity()
    scratch = ctx.task_dir(ws.task_id)
    scratch.mkdir(parents=True, exist_ok=True)
    checkout = scratch / f"verify-{turn}"
    shutil.rmtree(checkout, ignore_errors=True)
    container_id = None
    killer = None
    try:
        export_snapshot(ws.repository, snapshot, checkout, scratch)
        if owner is not None:
            chown_tree(checkout, *owner)
        container_id = ctx.sandbox.start(
            ContainerSpec(
                image=image,
                command=["sleep", "infinity"],
                user=user,
                labels=ctx.labels(ws.task_id, "verify", turn=str(turn)),
                mounts=[Mount(checkout, "/workspace", read_only=False)],
                env={"HOME": "/home/worker"},
                memory_mb=limits["memory_mb"],
                cpus=limits["cpus"],
                pids=limits["pids"],
                runtime=ctx.config.runtime,
            )
        )
        expired = threading.Event()

        def on_deadline() -> None:
            expired.set()
            ctx.sandbox.kill(container_id)

        killer = threading.Timer(max(remaining, 0.0), on_deadline)
        killer.daemon = True
        killer.start()
        for command in commands:
            if expired.is_set() or should_stop():
                break
            shown = redactor.redact(command)
            started = time.monotonic()
            code, out, err = ctx.sandbox.exec(
                container_id,
                ["sh", "-c", command],
                user=user,
                workdir="/workspace",
                env={"HOME": "/home/worker"},
                tail_chars=ctx.config.output_tail_chars,
            )
            record = {
                "command": shown,
                "exit_code": code,
                "duration_s": round(time.monotonic() - started, 3),
                "stdout_tail": redactor.redact(out),
                "stderr_tail": redactor.redact(err),
            }
            outcome.commands.append(record)
            emit("verification.command", record)
        outcome.timed_out = expired.is_set()
        outcome.ok = (
            not outcome.timed_out
            and len(outcome.commands) == len(commands)
            and all(c["exit_code"] == 0 for c in outcome.commands)
        )
        return outcome
    finally:
        if killer is not None:
            killer.cancel()
        if container_id:
            ctx.sandbox.remove(container_id)
        shutil.rmtree(checkout, ignore_errors=True)
