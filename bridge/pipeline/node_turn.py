"""A worker turn on a node of the cluster (docs/cluster.md), seen from the control host: the node
chosen (a slot of it leased in the store, as every limit is), the base sent as a git bundle
when the node lacks it, the turn's gateway opened here with a relay secret for the node, the
node's updates followed (its events recorded here, redacted again), and the snapshot taken back
only through `receive_snapshot`'s checks into the task's branch of the user's repository. What
the runner does next (the artifacts, the judge, the checks) is what it does after a local turn.

The node is touched each second while the turn runs; a node that says nothing for
`cluster.node_timeout_s` is lost: NodeLost names it, and the runner decides what follows."""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.asking import INFO_STRING, parse_request_block
from bridge.cluster.bundles import (
    BundleRefused,
    read_header,
    receive_snapshot,
)
from bridge.cluster.link import AgentLink, NodeInfo, NodeLost, NodeOverdue, Nodes, slot_scope
from bridge.cluster.orders import (
    Beat,
    ChecksDone,
    ChecksOrder,
    Events,
    GatewayTicket,
    Placed,
    TurnDone,
    TurnFailed,
    TurnOrder,
    Update,
)
from bridge.cluster.relay import RelayHub
from bridge.documents import AskedRequest, WorkerExit
from bridge.errors import BridgeError
from bridge.events import EventData
from bridge.phase.handle import PhaseHandle, Superseded
from bridge.phase.network import task_gateway
from bridge.pipeline.collect import CollectTimedOut, snapshot_limits
from bridge.pipeline.node_inputs import (
    bundles_lacking,
    give_image,
    image_order,
    outside_excludes,
)
from bridge.pipeline.scheduling import LEASE_TTL
from bridge.pipeline.verify import VerificationOutcome
from bridge.records import CommandResult, VerificationDoc
from bridge.store.owners import Owner
from bridge.workers import Turn, Worker
from bridge.workspace.diff import Change
from bridge.workspace.git import Git
from bridge.workspace.rawgit import repo_id
from bridge.workspace.snapshot import Snapshot
from bridge.workspace.worktree import TaskWorkspace

if TYPE_CHECKING:
    from bridge.store import Store

PLACE_EVERY_S = 0.25  # how often a turn waiting for a free slot looks again
TOUCH_EVERY_S = 1.0
# The events a worker turn records where it runs; the rest of a task's log (its statuses,
# repairs, follow-ups, cancels) is this host's, and a node's word is not taken for it.
NODE_EVENTS = ("worker.", "workspace.", "sandbox.")
CHECK_EVENTS = ("verification.command", "verification.checkout", "sandbox.")
NODE_TIMINGS = ("prepare_s", "worker_s", "snapshot_s")  # a node's TurnDone.seconds
EVENTS_SLACK = 200  # a turn's events besides its progress (started, completed, dropped...)
MOST_EVENT_BYTES = 16 << 20  # a turn's progress here: max_progress_events lines of 2,000 chars
WORKING, VERIFYING = "the worker was running", "verification was running"  # as timeout_error says


@dataclass
class NodeTurn:
    """How a node's turn ended: the worker's exit and, unless a limit stopped it first, the
    snapshot now in the task's branch here."""

    node: str
    exit: WorkerExit
    snapshot: Snapshot | None


_hubs: dict[tuple[str, tuple[int, int] | None], RelayHub] = {}
_hubs_lock = threading.Lock()


def relay_hub(host: str, ports: tuple[int, int] | None = None) -> RelayHub:
    """This process's relay hub on ``host`` in ``ports`` (one for all the turns whose config
    names that range), started on first use: on a free port of ``ports`` (LOW, HIGH), or any
    free one."""
    with _hubs_lock:
        hub = _hubs.get((host, ports))
        if hub is None:
            hub = _hubs[host, ports] = _started_hub(host, ports)
        return hub


def _started_hub(host: str, ports: tuple[int, int] | None) -> RelayHub:
    if ports is None:
        return RelayHub(host).start()
    for port in range(ports[0], ports[1] + 1):
        try:
            return RelayHub(host, port).start()
        except OSError:  # another process's
            continue
    raise BridgeError(
        f"Every port of cluster.relay_ports {ports[0]}-{ports[1]} is taken on {host}; widen it.",
        kind="cluster",
    )


def run_node_turn(
    handle: PhaseHandle,
    ws: TaskWorkspace,
    worker: Worker,
    turn: Turn,
    start: str,
    nodes: Nodes,
    owner: Owner,
    *,
    avoid: frozenset[str] = frozenset(),
) -> NodeTurn:
    """Run ``turn`` on a node (the one holding the task's worktree for a later turn; else the
    least busy alive one not in ``avoid``) and take its snapshot back into ``ws.branch``."""
    ctx = handle.ctx
    record = handle.record
    images = (image_order(handle, worker.image(ctx.config)),)
    # From the store: the handle's record is as the runner loaded it, without the node this
    # runner's earlier turn was placed on (a repair turn must go where the worktree is).
    pinned = ctx.store.load_task(handle.task_id).worker_node if turn.number > 0 else None
    node = _place(handle, nodes, owner, pinned, avoid)
    scope = slot_scope(node.name)
    try:
        link = nodes.agent(node.name)
        handle.update(worker_node=node.name)
        handle.emit("cluster.placed", {"node": node.name, "turn": turn.number})
        for image in images:
            give_image(handle, link, node.name, image)
        base = record.base_commit or ""
        routes = worker.routes(turn.metadata, ctx.config)
        order = TurnOrder(
            record=record,
            turn=turn,
            repo_key=repo_id(ws.repository),
            start=start,
            remaining_s=handle.remaining(),
            images=images,
            bundles=bundles_lacking(handle, link, ws),
            excludes=outside_excludes(ws.repository),
        )
        done = _turn_through_gateway(handle, nodes, link, node.name, order, routes)
    finally:
        ctx.store.leases.release_scope(handle.task_id, owner, scope)
    for key_ in NODE_TIMINGS:  # what a turn there measures, as numbers, or nothing
        value = done.seconds.get(key_)
        if isinstance(value, int | float) and math.isfinite(value):
            handle.timings[f"node_{key_}"] = round(float(value), 3)
    exit_info = _node_exit(handle, done.exit, turn.number)
    session = done.session_id if done.session_id and worker.session_ok(done.session_id) else None
    handle.update(worker_exit=exit_info, session_id=session or handle.record.session_id)
    if done.bundle is None or done.commit is None:
        return NodeTurn(node.name, exit_info, None)
    taken = time.monotonic()
    commit = _take_snapshot(handle, ws, done.bundle, done.commit, base)
    handle.timed("receive_s", taken)
    dropped = list(done.dropped[: handle.limits.files])  # no more than the worktree could hold
    return NodeTurn(node.name, exit_info, Snapshot(commit, dropped))


def _turn_through_gateway(
    handle: PhaseHandle,
    nodes: Nodes,
    link: AgentLink,
    node: str,
    order: TurnOrder,
    routes: list[str],
) -> TurnDone:
    """The order sent with the turn's gateway open here and a relay secret for the node's
    way to it (revoked when the turn ends); how the turn ended."""
    config = handle.ctx.config.cluster
    with task_gateway(handle, routes, order.turn.number) as gateway:
        hub = relay_hub(nodes.relay_host(), config.relay_ports) if gateway is not None else None
        secret = hub.open_turn(gateway.folder) if hub is not None and gateway else None
        try:
            ticket = GatewayTicket(hub.address, secret) if hub and secret else None
            sent = dataclasses.replace(order, gateway=ticket, remaining_s=handle.remaining())
            ordered = time.monotonic()
            updates = link.run_turn(sent, config.node_timeout_s)
            done = _follow(handle, link, node, updates, config.node_timeout_s)
            handle.timed("node_turn_s", ordered)  # the order's round trip, the node's work in it
        finally:
            if hub is not None and secret is not None:
                hub.close_turn(secret)
    if not isinstance(done, TurnDone):
        raise BridgeError(f"Node {node} answered a turn with checks.", kind="cluster")
    return done


def _node_exit(handle: PhaseHandle, said: WorkerExit, turn: int) -> WorkerExit:
    """The node's account of the worker's exit as a turn here records it (worker_turn.py):
    redacted with this host's secrets (a route's key is known here only), as bounded, for this
    turn, its request read again by the one parser (a node is believed no more than a worker's
    final message); BridgeError when it is no account of an exit."""
    redact, tail = handle.redactor.redact, handle.ctx.config.output_tail_chars
    try:
        found = WorkerExit.model_validate(said.model_dump(exclude={"request"}))
    except ValueError as exc:  # pydantic's ValidationError
        raise BridgeError(
            "The node's account of the worker's exit is not one.", kind="cluster"
        ) from exc
    return found.model_copy(
        update={
            "turn": turn,
            "summary": redact(found.summary)[:tail],
            "last_progress": redact(found.last_progress)[:300],
            "failure": redact(found.failure)[:500] if found.failure else None,
            "over_limit": redact(found.over_limit)[:500] if found.over_limit else None,
            "request": _asked_again(said.request),
        }
    )


def _asked_again(request: object) -> AskedRequest | None:
    """A request a node says the worker's final message held, as the parser takes it from a
    block of its own; None when it would not."""
    if not isinstance(request, dict) or not isinstance(request.get("detail"), dict):
        return None
    body = json.dumps({"kind": request.get("kind"), **request["detail"]}, separators=(",", ":"))
    return parse_request_block(f"```{INFO_STRING}\n{body}\n```")


def _take_snapshot(
    handle: PhaseHandle, ws: TaskWorkspace, bundle: bytes, claimed: str, base: str
) -> str:
    """The node's snapshot into the task's branch, only through `receive_snapshot`."""
    task_dir = handle.ctx.task_dir(handle.task_id)
    task_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=task_dir) as scratch:
        path = Path(scratch) / "snapshot.bundle"
        path.write_bytes(bundle)
        _check_claim(path, claimed)
        return receive_snapshot(
            ws.repository,
            path,
            base,
            f"refs/heads/{ws.branch}",
            snapshot_limits(handle.limits),
            Path(scratch),
        )


@dataclass(frozen=True)
class Checks:
    """A turn's checks: the commands, on a clean checkout of ``snapshot`` (whose paths
    ``changes`` left the base), in ``image``."""

    snapshot: str
    changes: list[Change]
    commands: list[str]
    image: str
    turn: int


def run_node_checks(
    handle: PhaseHandle,
    ws: TaskWorkspace,
    checks: Checks,
    nodes: Nodes,
    owner: Owner,
    *,
    avoid: frozenset[str] = frozenset(),
) -> VerificationOutcome:
    """The checks on a node (another than the worker's when one has a slot, none of
    ``avoid``: lost earlier); once more on another node when that one is lost (they change
    nothing: running them again costs no budget)."""
    try:
        return _checks_on_node(handle, ws, checks, nodes, owner, avoid)
    except NodeLost as exc:
        data = {"node": exc.node, "turn": checks.turn, "checks": True}
        handle.emit("cluster.node_lost", data)
        return _checks_on_node(handle, ws, checks, nodes, owner, avoid | {exc.node})


def _checks_on_node(
    handle: PhaseHandle,
    ws: TaskWorkspace,
    checks: Checks,
    nodes: Nodes,
    owner: Owner,
    avoid: frozenset[str],
) -> VerificationOutcome:
    """The checks on one node, from bundles of the base and the snapshot; the node's
    checked-out tree must be the snapshot's own here, or the result is not taken."""
    ctx = handle.ctx
    snapshot, turn, commands = checks.snapshot, checks.turn, checks.commands
    worker_node = ctx.store.load_task(handle.task_id).worker_node
    order_image = image_order(handle, checks.image)
    node = _place(handle, nodes, owner, None, avoid, shun=worker_node)
    try:
        link = nodes.agent(node.name)
        handle.update(verify_node=node.name)
        handle.emit("cluster.checks_placed", {"node": node.name, "turn": turn})
        give_image(handle, link, node.name, order_image)
        timeout_s = ctx.config.cluster.node_timeout_s
        order = ChecksOrder(
            record=handle.record,
            repo_key=repo_id(ws.repository),
            turn=turn,
            snapshot=snapshot,
            changes=tuple(checks.changes),
            commands=tuple(commands),
            image=order_image,
            remaining_s=handle.remaining(),
            bundles=bundles_lacking(handle, link, ws, snapshot),
        )
        updates = link.run_checks(order, timeout_s)
        done = _follow(handle, link, node.name, updates, timeout_s, CHECK_EVENTS, VERIFYING)
    finally:
        ctx.store.leases.release_scope(handle.task_id, owner, slot_scope(node.name))
    if not isinstance(done, ChecksDone):
        raise BridgeError(f"Node {node.name} answered checks with a turn.", kind="cluster")
    tree = Git(ws.repository).run("rev-parse", f"{snapshot}^{{tree}}").stdout.decode().strip()
    if done.tree != tree:
        raise BridgeError(
            f"Node {node.name} checked tree {done.tree[:12]}, not the snapshot's {tree[:12]}; "
            "its checks were not taken.",
            kind="cluster",
        )
    results = _node_results(handle, node.name, done.verification, len(commands))
    timed_out = bool(done.timed_out)
    ok = not timed_out and all(c.passed for c in results)  # as run_commands has it
    return VerificationOutcome(ok=ok, image=checks.image, commands=results, timed_out=timed_out)


def _node_results(
    handle: PhaseHandle, node: str, doc: VerificationDoc, ordered: int
) -> list[CommandResult]:
    """The node's result of each command it was sent, redacted with this host's secrets and
    bounded as run_commands bounds them. The node is trusted with each result (as the engine
    is on one host), not with leaving one out: BridgeError when it reports another number."""
    try:
        found = VerificationDoc.model_validate(handle.redactor.redact_data(doc.model_dump()))
    except ValueError as exc:  # pydantic's ValidationError
        raise BridgeError(f"Node {node}'s checks report is not one.", kind="cluster") from exc
    if len(found.commands) != ordered:
        raise BridgeError(
            f"Node {node} reported {len(found.commands)} results of the {ordered} checks it was "
            "sent; its checks were not taken.",
            kind="cluster",
        )
    chars = handle.ctx.config.output_tail_chars
    return [
        c.model_copy(
            update={"stdout_tail": c.stdout_tail[-chars:], "stderr_tail": c.stderr_tail[-chars:]}
        )
        for c in found.commands
    ]


def _check_claim(bundle: Path, claimed: str) -> None:
    """BundleRefused unless ``bundle`` holds the commit its node reported: a node that says
    one thing and sends another is believed on neither."""
    sent = sorted(sha for sha, _ in read_header(bundle).refs)
    if claimed not in sent:
        raise BundleRefused(
            f"The node's snapshot bundle holds {', '.join(s[:12] for s in sent) or 'nothing'}, "
            f"not the commit {claimed[:12]!r} the node reported; it was not taken."
        )


def nodes_placed(nodes: Nodes, store: Store, task_id: str) -> set[str]:
    """The alive nodes this host placed the task's turns or checks on (by its own events,
    which no node can write): an earlier turn's or checks' node holds the task too."""
    kinds = ("cluster.placed", "cluster.checks_placed")
    found = store.events(task_id, limit=1_000_000, kinds=kinds)
    named = {str(event.data.get("node")) for event in found}
    return {node.name for node in nodes.nodes() if node.alive and node.name in named}


def release_task(nodes: Nodes, node: str, task_id: str) -> bool:
    """Tell ``node`` the task is done with it (its containers and workspace go); False when
    the node does not answer (its agent reaps them when it starts again)."""
    try:
        nodes.agent(node).release(task_id)
    except BridgeError:
        return False
    return True


def _place(
    handle: PhaseHandle,
    nodes: Nodes,
    owner: Owner,
    pinned: str | None,
    avoid: frozenset[str],
    shun: str | None = None,
) -> NodeInfo:
    """A node with a free slot, its slot leased to the task; waits while all are busy.
    ``shun``: taken only when no other node has a slot (the checks, away from the worker's)."""
    store = handle.ctx.store
    while True:
        alive = [n for n in nodes.nodes() if n.alive and n.name not in avoid]
        if pinned is not None:
            alive = [n for n in alive if n.name == pinned]
            if not alive:
                raise NodeLost(
                    pinned,
                    f"Task {handle.task_id}'s worktree is on node {pinned}, which is not alive;"
                    " `worker-bridge tasks retry` runs the task again elsewhere.",
                )
        if not alive:
            raise BridgeError(
                "No node of the cluster is alive to run the task; start one with "
                "`worker-bridge node start` or check `worker-bridge cluster status`.",
                kind="cluster",
            )
        used: dict[str, int] = {}
        for lease in store.leases.live():
            used[lease["scope"]] = used.get(lease["scope"], 0) + 1
        for node in sorted(
            alive,
            key=lambda n: (n.name == shun, used.get(slot_scope(n.name), 0) / n.slots, n.name),
        ):
            scope = slot_scope(node.name)
            if store.leases.acquire(handle.task_id, owner, {scope: node.slots}, LEASE_TTL):
                return node
        handle.ensure_active()
        if handle.remaining() <= 0:
            raise BridgeError("No node had a free slot before the task's deadline.", kind="timeout")
        time.sleep(PLACE_EVERY_S)


def _follow(
    handle: PhaseHandle,
    link: AgentLink,
    node: str,
    updates: Iterator[Update],
    timeout_s: float,
    kinds: tuple[str, ...] = NODE_EVENTS,
    phase: str = WORKING,
) -> TurnDone | ChecksDone:
    """The node's updates until the turn ends: events recorded here, cancels passed on, the
    node touched each second; NodeLost when it falls silent. A node that goes on beating is
    not followed past the task's deadline, or a cancel, by more than ``timeout_s``: the
    deadline and the cancel are this host's, whatever the node does with them."""
    stop = threading.Event()
    lost: list[NodeLost] = []

    def toucher() -> None:
        silent_since = time.monotonic()
        while not stop.wait(TOUCH_EVERY_S):
            try:
                link.touch(handle.task_id)
                silent_since = time.monotonic()
            except NodeLost as exc:
                if time.monotonic() - silent_since > timeout_s:
                    lost.append(exc)
                    return

    threading.Thread(target=toucher, name=f"touch-{handle.task_id}", daemon=True).start()
    cancelled_at: float | None = None
    log = _NodeEvents(handle, node, kinds)
    try:
        for update in updates:
            if lost:
                raise lost[0]
            if isinstance(update, Events):
                for kind, data in update.events:
                    log.record(kind, data)
            elif isinstance(update, (TurnDone, ChecksDone)):
                return update
            elif isinstance(update, TurnFailed):
                if update.superseded or cancelled_at is not None:
                    raise Superseded("cancelled")
                if update.kind == "collect_timeout":
                    raise CollectTimedOut()
                raise BridgeError(update.message, kind=update.kind)
            elif isinstance(update, (Placed, Beat)):
                pass
            if cancelled_at is None and handle.stopped():
                cancelled_at = time.monotonic()
                link.cancel(handle.task_id)  # the node ends the turn and says so
            elif cancelled_at is not None and time.monotonic() - cancelled_at > timeout_s:
                raise Superseded("cancelled")  # ... or is not waited for
            elif handle.remaining() < -timeout_s:
                link.cancel(handle.task_id)
                raise NodeOverdue(node, phase)
        raise NodeLost(node, f"Node {node} ended the turn without a word.")
    finally:
        stop.set()


class _NodeEvents:
    """What a node's turn writes into the task's log here: the ``kinds`` a turn records where
    it runs, no more of them than a turn here records (its progress bounded by
    max_progress_events, the rest by EVENTS_SLACK) and at most MOST_EVENT_BYTES; past that, one
    `cluster.events_cut` says so."""

    def __init__(self, handle: PhaseHandle, node: str, kinds: tuple[str, ...]) -> None:
        self.handle, self.node, self.kinds = handle, node, kinds
        self.progress = handle.ctx.config.max_progress_events + 1  # and the note of its cut
        self.left, self.bytes_left = self.progress + EVENTS_SLACK, MOST_EVENT_BYTES
        self.cut = False

    def record(self, kind: str, data: EventData) -> None:
        if not kind.startswith(self.kinds):
            return
        size, progress = len(json.dumps(data, default=str)), kind == "worker.progress"
        if self.left <= 0 or size > self.bytes_left or (progress and self.progress <= 0):
            if not self.cut:
                self.cut = True
                self.handle.emit("cluster.events_cut", {"node": self.node})
            return
        self.left, self.bytes_left, self.progress = (
            self.left - 1,
            self.bytes_left - size,
            self.progress - progress,
        )
        self.handle.emit(kind, {**data, "node": self.node} if kind == "worker.started" else data)
