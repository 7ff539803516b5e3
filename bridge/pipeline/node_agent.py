"""A node's agent: worker-bridge's own phases run against the node's own engine.

The agent is a small bridge of its own on the node: a private state root (its store, its
worktrees, its copies of the repositories the tasks come from, made from the control host's
bundles), the unchanged Docker sandbox against the node's engine, and for each task a shadow
record in its store (the control host's record: same id, spec, limits; this state root for a
home). A worker turn there is what it is on one host: the workspace made
(`create_workspace`), the worker's container run (`run_worker_turn`, every hardening the same),
the worktree snapshotted (`take_snapshot`). The turn's way out is the relay to the control
host's gateway (bridge/cluster/relay.py), so no key is ever on the node. The snapshot goes back
as a thin bundle of one commit on the base; the control host checks it again before it takes
it (bridge/cluster/bundles.py: `receive_snapshot`).

While a turn runs, `run_turn` yields what the turn recorded (events, a beat each second) and
then how it ended. The control host touches the turn while it listens (`touch`): a turn
nobody touched for its `cluster.node_timeout_s` (the control host died or lost the node) is
cancelled here, its container removed. The workspace of a task stays on the node for its next
turn (a repair, an answer) until the control host releases it (`release`); an agent that starts
finds the tasks its predecessor left running (its node went down) and ends them (`reap`)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bridge.cluster.bundles import bundle_bytes, unbundle
from bridge.cluster.images import check_image
from bridge.cluster.orders import (
    Beat,
    ChecksDone,
    ChecksOrder,
    Events,
    GatewayTicket,
    ImageOrder,
    Placed,
    TurnDone,
    TurnFailed,
    TurnOrder,
    Update,
)
from bridge.cluster.relay import RelayFolder
from bridge.config.sections import ClusterConfig, GatewayConfig
from bridge.config.settings import Config
from bridge.errors import BridgeError
from bridge.host.state_root import make_private
from bridge.models import TERMINAL, Status
from bridge.phase.context import Context
from bridge.phase.handle import PhaseHandle, Superseded
from bridge.phase.network import GatewayOpener, needs_gateway
from bridge.pipeline.checkout import VerifyCheckout
from bridge.pipeline.collect import CollectTimedOut, disarm_workspace, take_snapshot
from bridge.pipeline.prepare import prepare_workspace
from bridge.pipeline.prune import prune
from bridge.pipeline.results import redactor_for
from bridge.pipeline.verify import run_verification
from bridge.pipeline.worker_turn import run_worker_turn
from bridge.records import NewTask, TaskRecord
from bridge.sandbox import LABEL, Sandbox
from bridge.sandbox.docker import DockerSandbox
from bridge.store import Store
from bridge.workers import get_worker
from bridge.workspace import fs
from bridge.workspace.baseline import record_files
from bridge.workspace.git import Git
from bridge.workspace.locks import repository_lock
from bridge.workspace.worktree import TaskWorkspace, remove_workspace

BATCH_S = 0.25  # how often a running turn's new events are sent
BEAT_S = 1.0  # a beat at least this often when there is nothing new
UPLOAD_STALE_S = 900.0  # parts come every few seconds; a load reads the file for 600 s at most
SHADOW_EVENTS = frozenset({"task.created", "task.status"})  # the node's own bookkeeping


class RelayPort:
    """The relay's folder as the worker container's gateway (bridge/phase/network.py)."""

    def __init__(self, folder: Path, routes: list[str], config: GatewayConfig) -> None:
        self.folder, self.routes, self.config = folder, routes, config


class NodeAgent:
    """The agent of one node: ``root`` holds its private state root (`state`) and its copies of
    the control host's repositories (`repositories`, outside the state root as a user's are);
    ``sandbox`` is its engine."""

    def __init__(self, name: str, root: Path, sandbox: Sandbox) -> None:
        self.name = name
        self.root = root
        self.home = root / "state"
        make_private(root)
        make_private(self.home)
        self.store = Store(self.home / "bridge.db")
        self.sandbox = sandbox
        self._touched: dict[str, float] = {}  # task id -> when the control host last listened
        self._lock = threading.Lock()

    # -- what the control host asks ---------------------------------------------------------

    def missing(self, repo_key: str, commits: list[str]) -> list[str]:
        """Those of ``commits`` this node does not hold for ``repo_key``'s repository."""
        repo = self._repository(repo_key)
        git = Git(repo)
        return [
            c
            for c in commits
            if git.run("cat-file", "-e", f"{c}^{{commit}}", check=False).returncode
        ]

    def touch(self, task_id: str) -> str:
        """The control host still listens to ``task_id``'s turn; answers the node's name."""
        with self._lock:
            if task_id in self._touched:
                self._touched[task_id] = time.monotonic()
        return self.name

    def cancel(self, task_id: str) -> None:
        """End the task's turn here: its shadow cancelled, its containers removed."""
        if self._known(task_id):
            self.store.transition(
                task_id, Status.CANCELLED, expect={Status.QUEUED, Status.RUNNING, Status.VERIFYING}
            )
        self.sandbox.remove_by_labels({f"{LABEL}.task": task_id})

    def release(self, task_id: str) -> None:
        """The task is done with this node: its turn ended, its workspace and folders removed."""
        self.cancel(task_id)
        if not self._known(task_id):
            return
        record = self.store.load_task(task_id)
        ws = TaskWorkspace.plan(self.home, Path(record.repository), task_id)
        remove_workspace(self.home, ws, delete_branch=True)
        fs.remove_tree(self.home / "tasks" / task_id)  # the worker's CLI home: however odd
        fs.remove_tree(self.home / "gateways" / task_id)
        with self.store.transaction() as conn:  # the shadow goes too: a new attempt starts anew
            conn.execute("DELETE FROM events WHERE task_id = ?", (task_id,))
            conn.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,))

    def reap(self) -> list[str]:
        """Release every task this node holds whose turn no thread of this agent runs: what a
        former agent left (its node went down with it) and turns ended here because the
        control host stopped listening (a cut link). The control host releases the tasks it
        finished itself; a task between turns here is released too, and its next turn fails
        naming the node. Image uploads given up on go too (`_sweep_uploads`). Returns the
        tasks' ids."""
        with self._lock:
            running = set(self._touched)
        rows = self.store.query("SELECT task_id FROM tasks")
        left = [row["task_id"] for row in rows if row["task_id"] not in running]
        for task_id in left:
            self.release(task_id)
        self._prune()
        self._sweep_uploads()
        return left

    def _prune(self) -> None:
        """What no task of this node's store references any more (orphan folders, base trees
        and object caches no checkout uses, containers of tasks it no longer knows) removed,
        as `workspaces prune --apply` does on one host: a node's disk does not grow with
        every base it was sent."""
        config = Config.from_record({"home": str(self.home)})
        prune(Context(config, self.store, self.sandbox), apply=True)

    def images(self) -> list[str]:
        """The image ids this node's engine holds, of worker-bridge's images."""
        return sorted({info.id for info in self.sandbox.images({})})

    def has_image(self, reference: str, image_id: str) -> bool:
        """Whether this node's engine holds ``reference`` as the control host's ``image_id``."""
        found = self.sandbox.inspect_image(reference)
        return found is not None and found.id == image_id

    def image_part(self, upload: str, index: int, data: bytes) -> None:
        """Part ``index`` of an image archive the control host streams here (no registry)."""
        path = self._upload(upload)
        if index == 0:
            self._sweep_uploads()
            path.unlink(missing_ok=True)
        with path.open("ab") as out:
            out.write(data)

    def image_done(self, upload: str, reference: str, image_id: str) -> None:
        """The streamed archive into this node's engine, tagged ``reference``; ImageMismatch
        unless it is the control host's ``image_id``."""
        path = self._upload(upload)
        try:
            if not isinstance(self.sandbox, DockerSandbox):
                raise BridgeError(f"{self.name}'s engine cannot load an image archive.")
            from bridge.sandbox import distribution

            with path.open("rb") as archive:
                distribution.load(self.sandbox, iter(lambda: archive.read(1 << 20), b""))
            if self.sandbox.inspect_image(image_id) is not None:
                distribution.tag(self.sandbox, image_id, reference)
            check_image(self.sandbox, reference, image_id, node_name=self.name)
        finally:
            path.unlink(missing_ok=True)

    def _sweep_uploads(self) -> None:
        """Uploads nothing was written to for UPLOAD_STALE_S: their control host gave up on
        them (it died, or lost this node mid-stream)."""
        stale = time.time() - UPLOAD_STALE_S
        for path in (self.root / "uploads").glob("*.tar"):
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < stale:
                    path.unlink()

    def _upload(self, upload: str) -> Path:
        if not upload.isalnum():
            raise BridgeError(f"'{upload[:40]}' is not an upload's name.", kind="cluster")
        folder = self.root / "uploads"
        folder.mkdir(mode=0o700, exist_ok=True)
        return folder / f"{upload}.tar"

    # -- one turn ---------------------------------------------------------------------------

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        """Run one worker turn; yields where it runs, its events as they come, a beat each
        second, and last how it ended. ``timeout_s``: a turn nobody touched for this long is
        cancelled (see `touch`)."""
        task_id, fresh = order.record.task_id, order.turn.number == 0
        yield from self._streamed(task_id, lambda: self._turn(order), timeout_s, fresh=fresh)

    def run_checks(self, order: ChecksOrder, timeout_s: float) -> Iterator[Update]:
        """Run one turn's checks on this node, reported as `run_turn` reports a turn."""
        yield from self._streamed(order.record.task_id, lambda: self._checks(order), timeout_s)

    def _streamed(
        self, task_id: str, work: Callable[[], Update], timeout_s: float, *, fresh: bool = False
    ) -> Iterator[Update]:
        yield Placed(self.name)
        # The task ordered again (its runner died, another took it over): an earlier attempt
        # still running here ends first.
        yield from self._superseding(task_id, fresh=fresh)
        with self._lock:
            if task_id in self._touched:
                yield TurnFailed("cluster", f"Task {task_id} already has a turn on {self.name}.")
                return
            self._touched[task_id] = time.monotonic()
        result: list[Update] = []
        abandoned = False  # the control host stopped listening: nobody will release it
        try:
            after = self.store.last_event()
            worker = threading.Thread(
                target=self._work_thread, args=(work, result), name=f"turn-{task_id}", daemon=True
            )
            worker.start()
            last_sent = time.monotonic()
            while True:
                worker.join(BATCH_S)
                events = self.store.events(task_id, after=after, limit=500)
                if events:
                    after = events[-1].event_id
                    kept = tuple((e.kind, e.data) for e in events if e.kind not in SHADOW_EVENTS)
                    if kept:
                        last_sent = time.monotonic()
                        yield Events(kept)
                        continue
                if not worker.is_alive():
                    break
                if not abandoned and self._untouched(task_id, timeout_s):
                    abandoned = True
                    self.cancel(task_id)  # the control host is gone: the turn ends here
                if time.monotonic() - last_sent >= BEAT_S:
                    last_sent = time.monotonic()
                    yield Beat()
        finally:
            with self._lock:
                self._touched.pop(task_id, None)
            if abandoned:  # its shadow, cancelled, can serve no later turn: nothing is kept
                self.release(task_id)
        yield (
            result[0]
            if result
            else TurnFailed("internal", f"The turn on {self.name} ended without a result.")
        )

    def _superseding(self, task_id: str, *, fresh: bool, wait_s: float = 60) -> Iterator[Update]:
        """An earlier attempt of the task still running here ended, and waited for with a beat
        each second (the control host counts this node's silence). For a first turn it is
        cancelled (its workspace is made again); for a later one only its containers go, so
        the task's worktree and shadow stay for the turn ordered now (what the ended attempt
        had written is in the worktree, as a killed worker's would be)."""
        with self._lock:
            busy = task_id in self._touched
        if not busy:
            return
        if fresh:
            self.cancel(task_id)
        else:
            self.sandbox.remove_by_labels({f"{LABEL}.task": task_id})
        deadline, beat_at = time.monotonic() + wait_s, time.monotonic() + BEAT_S
        while time.monotonic() < deadline:
            with self._lock:
                if task_id not in self._touched:
                    return
            time.sleep(0.1)
            if time.monotonic() >= beat_at:
                beat_at += BEAT_S
                yield Beat()

    def _untouched(self, task_id: str, timeout_s: float) -> bool:
        with self._lock:
            touched = self._touched.get(task_id, time.monotonic())
        return time.monotonic() - touched > timeout_s

    def _work_thread(self, work: Callable[[], Update], result: list[Update]) -> None:
        try:
            result.append(work())
        except Superseded:
            result.append(TurnFailed("cancelled", "The task was cancelled.", superseded=True))
        except CollectTimedOut:
            result.append(
                TurnFailed("collect_timeout", "Collecting the worker's changes timed out.")
            )
        except BridgeError as exc:
            result.append(TurnFailed(exc.kind, exc.message))
        except Exception as exc:  # noqa: BLE001 - the control host ends the task with it
            detail = traceback.format_exc()[-1500:]
            result.append(
                TurnFailed(
                    "internal",
                    f"The node {self.name} hit an internal error ({exc.__class__.__name__}: "
                    f"{str(exc)[:200]}).\n{detail}",
                )
            )

    def _turn(self, order: TurnOrder) -> TurnDone:
        record = order.record
        base = record.base_commit or ""
        repo = self._repository(order.repo_key, order.bundles)
        self._excludes(repo, order.excludes)
        turn = order.turn
        shadow = self._shadow(
            record, repo, turn.number, turn.session_id, order.remaining_s, fresh=turn.number == 0
        )
        handle = self._handle(shadow, order.remaining_s)
        ctx = handle.ctx
        for image in order.images:
            self._ensure_image(image)
        worker = get_worker(ctx.config, record.spec.worker)
        ws = TaskWorkspace.plan(self.home, repo, record.task_id)
        seconds: dict[str, float] = {}
        t0 = time.monotonic()
        if order.turn.number == 0 or not ws.worktree.is_dir():
            if order.start != base:
                raise BridgeError(
                    f"Task {record.task_id}'s worktree is not on {self.name} (its node was lost"
                    " or it was released); `worker-bridge tasks retry` runs it again.",
                    kind="cluster",
                )
            prepare_workspace(handle, ws, sweep=ws.worktree.exists() or ws.admin.exists())
        seconds["prepare_s"] = round(time.monotonic() - t0, 3)
        baseline = (
            record_files(ws.worktree, limit=handle.limits.files) if ws.upper is None else None
        )
        t0 = time.monotonic()
        exit_info = run_worker_turn(
            handle, ws, worker, order.turn, resume=False, gateway=self._opener(order.gateway)
        )
        seconds["worker_s"] = round(time.monotonic() - t0, 3)
        handle.ensure_active()
        session = self.store.load_task(record.task_id).session_id
        if exit_info.over_limit:
            disarm_workspace(handle, ws)
            return TurnDone(exit_info, session, seconds=seconds)
        t0 = time.monotonic()
        snapshot = take_snapshot(handle, ws, order.start, baseline)
        bundle = bundle_bytes(repo, snapshot.commit, exclude=base)
        seconds["snapshot_s"] = round(time.monotonic() - t0, 3)
        return TurnDone(
            exit_info,
            session,
            commit=snapshot.commit,
            bundle=bundle,
            dropped=tuple(snapshot.dropped),
            seconds=seconds,
        )

    def _checks(self, order: ChecksOrder) -> ChecksDone:
        record = order.record
        repo = self._repository(order.repo_key, order.bundles)
        shadow = self._shadow(record, repo, order.turn, None, order.remaining_s, fresh=False)
        handle = self._handle(shadow, order.remaining_s)
        ws = TaskWorkspace.plan(self.home, repo, record.task_id)
        # The base checked out (layered: mounted over its kept tree) while the image is made
        # sure of; only the snapshot's changed paths are then brought in, as on one host.
        checkout = VerifyCheckout(handle, ws, record.base_commit or "", order.turn).start()
        try:
            self._ensure_image(order.image)
        except BaseException:
            checkout.discard()  # run_verification discards it from here on
            raise
        outcome = run_verification(
            handle,
            checkout,
            order.snapshot,
            list(order.changes),
            list(order.commands),
            order.image.reference,
            order.turn,
        )
        handle.ensure_active()
        tree = Git(repo).run("rev-parse", f"{order.snapshot}^{{tree}}").stdout.decode().strip()
        return ChecksDone(outcome.document(), outcome.timed_out, tree)

    def _handle(self, shadow: TaskRecord, remaining_s: float) -> PhaseHandle:
        return PhaseHandle(
            task_id=shadow.task_id,
            record=shadow,
            ctx=Context(shadow.config, self.store, self.sandbox),
            redactor=redactor_for(shadow),
            deadline_at=time.time() + remaining_s,
        )

    # -- the pieces -------------------------------------------------------------------------

    def _known(self, task_id: str) -> bool:
        return bool(self.store.query("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)))

    def _repository(self, repo_key: str, bundles: tuple[bytes, ...] = ()) -> Path:
        """This node's copy of a repository of the control host (``repo_key`` names it), made
        on first use, with ``bundles`` fetched into it (each kept by a ref of its commit)."""
        if not repo_key.isalnum():
            raise BridgeError(f"'{repo_key[:40]}' is not a repository key.", kind="cluster")
        repo = self.root / "repositories" / repo_key
        with self._lock:  # two turns' first use at once
            if not (repo / ".git").is_dir():
                repo.mkdir(parents=True, exist_ok=True)
                Git(repo).run("init", "--quiet")
        if not bundles:
            return repo
        with repository_lock(self.home, repo):
            for data in bundles:
                unbundle(repo, data, "refs/worker-bridge/bases/")
        return repo

    def _excludes(self, repo: Path, rules: str) -> None:
        """The control host's ignore rules from outside the tree, as this copy's
        .git/info/exclude (written only when they changed)."""
        path = repo / ".git" / "info" / "exclude"
        data = rules.encode("utf-8", "surrogateescape")
        with repository_lock(self.home, repo):
            try:
                if path.read_bytes() == data:
                    return
            except OSError:
                pass
            # Only the control host's rules apply, never this machine's own excludes file.
            Git(repo).run("config", "core.excludesFile", os.devnull)
            path.parent.mkdir(exist_ok=True)
            partial = path.with_name("exclude.part")
            partial.write_bytes(data)
            partial.replace(path)

    def _shadow(
        self,
        record: TaskRecord,
        repo: Path,
        turn: int,
        session_id: str | None,
        remaining_s: float,
        *,
        fresh: bool,
    ) -> TaskRecord:
        """The node's record of the task for this turn, made on its first use here (``fresh``:
        a first turn, which starts from nothing whatever an earlier attempt left)."""
        config = record.config.model_copy(
            update={
                "home": self.home,
                "store": None,
                "cluster": ClusterConfig(),
                "extra_ca_file": record.config.extra_ca_file
                if record.config.extra_ca_file and record.config.extra_ca_file.is_file()
                else None,
            }
        )
        fields: dict[str, Any] = {
            "turn": turn,
            "follow_ups": list(record.follow_ups),
            "deadline_at": time.time() + remaining_s,
        }
        if session_id is not None or fresh:
            fields["session_id"] = session_id
            fields["worker_exit"] = None
        if fresh and self._known(record.task_id):
            self.release(record.task_id)  # an earlier attempt's, never released: from nothing
        if not self._known(record.task_id):
            new = NewTask(
                task_id=record.task_id,
                spec=record.spec,
                repository=str(repo),
                base_commit=record.base_commit or "",
                config=config,
                limits=record.limits,
                profile=record.profile,
            )
            self.store.insert_task(new, {"node": self.name})
            self.store.transition(record.task_id, Status.QUEUED, expect={Status.CREATED})
        status = self.store.status(record.task_id)
        if status in TERMINAL:
            raise Superseded(status)
        if status == Status.QUEUED:
            self.store.transition(
                record.task_id, Status.RUNNING, expect={Status.QUEUED}, phase="worker", **fields
            )
        else:
            self.store.update_task(record.task_id, **fields)
        return self.store.load_task(record.task_id)

    def _ensure_image(self, image: ImageOrder) -> None:
        """The image is on this node's engine with the control host's id, pulled by digest
        when it is missing and the order says from where; ImageMismatch otherwise."""
        found = self.sandbox.inspect_image(image.reference)
        if (found is None or found.id != image.image_id) and image.pull is not None:
            if isinstance(self.sandbox, DockerSandbox):
                from bridge.sandbox import distribution

                distribution.pull(self.sandbox, image.pull)
                distribution.tag(self.sandbox, image.image_id, image.reference)
        check_image(self.sandbox, image.reference, image.image_id, node_name=self.name)  # type: ignore[arg-type]

    def _opener(self, ticket: GatewayTicket | None) -> GatewayOpener:
        """The turn's way out: a relay folder to the control host's gateway, when it has one."""

        @contextmanager
        def open_relay(
            handle: PhaseHandle, routes: list[str], turn: int
        ) -> Iterator[RelayPort | None]:
            if ticket is None or not needs_gateway(handle, routes):
                yield None
                return
            folder = handle.ctx.home / "gateways" / handle.task_id
            owner = handle.ctx.sandbox_identity()[1]
            relay = RelayFolder(folder, ticket.hub, ticket.secret, owner).start()
            try:
                yield RelayPort(folder, routes, handle.ctx.config.gateway)
            finally:
                relay.stop()

        return open_relay
