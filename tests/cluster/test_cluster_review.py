"""A hostile review of the cluster's executor (engine-free: node agents in this process, each
its own state root and FakeSandbox, as test_executor*.py run them). Each test is one finding:
what a hostile worker, a lying node, a lost one or a cancel could do that one host would not
let happen, or what the executor left behind."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.local_nodes import (  # noqa: F401 - the autouse fixture
    make_nodes,
    on_worker_start,
    run,
    turns_end_before_the_folders_go,
)
from support.tasks import mock_task
from support.waiting import poll

from bridge import WorkerBridge
from bridge.cluster.orders import (
    Beat,
    ChecksDone,
    ChecksOrder,
    Events,
    Placed,
    TurnDone,
    TurnOrder,
    Update,
)
from bridge.phase.network import RELAY
from bridge.pipeline.node_agent import NodeAgent
from bridge.pipeline.nodes import LocalNodes
from bridge.records import VerificationDoc
from bridge.sandbox.fake import FakeSandbox
from bridge.store.owners import Owner

# -- the cluster: agents in this process -------------------------------------------------------


def bridge_on(home: Path, nodes: LocalNodes, config: str = "") -> WorkerBridge:
    if config:
        (home / "config.yaml").write_text(config)
    return WorkerBridge(home=home, sandbox=FakeSandbox(), nodes=nodes)


def logged(bridge: WorkerBridge, task_id: str) -> list:
    return bridge.task_logs(task_id, limit=100_000).events


def shadows(agent: NodeAgent) -> list[str]:
    return [row["task_id"] for row in agent.store.query("SELECT task_id FROM tasks")]


def in_thread(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


# -- the node's collect timing out --------------------------------------------------------------


def test_a_collect_that_timed_out_on_a_node_times_the_task_out_as_it_would_here(
    home, workdir, repo, monkeypatch
):
    """One host: collect past the deadline is `timed_out` (kind timeout). A node says
    `collect_timeout`; the control host turned that into an internal error."""
    from bridge.pipeline import node_agent
    from bridge.pipeline.collect import CollectTimedOut

    def timed_out(*args: object, **kwargs: object) -> None:
        raise CollectTimedOut()

    monkeypatch.setattr(node_agent, "take_snapshot", timed_out)
    bridge = bridge_on(home, make_nodes(workdir))
    try:
        result = run(bridge, mock_task(repo, {"write": {"a": "a"}}))
        kinds = [e.kind for e in logged(bridge, result.task_id)]
    finally:
        bridge.close()
    assert result.status == "timed_out", result.error
    assert result.error.kind == "timeout"
    assert "task.internal_error" not in kinds


# -- a node that never ends its turn -------------------------------------------------------------


class BeatingAgent(NodeAgent):
    """A node that says it started the turn and then only beats: it ignores the deadline and
    any cancel (a compromised agent, or one wedged in its engine)."""

    stop = threading.Event()

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        yield Placed(self.name)
        until = time.monotonic() + 60
        while not self.stop.is_set() and time.monotonic() < until:
            time.sleep(0.05)
            yield Beat()


@pytest.fixture
def beating(workdir: Path) -> Iterator[LocalNodes]:
    BeatingAgent.stop = threading.Event()
    yield make_nodes(workdir, ("n1",), BeatingAgent)
    BeatingAgent.stop.set()


def test_a_node_that_beats_past_the_task_s_deadline_does_not_keep_the_task_running(
    home, repo, beating
):
    bridge = bridge_on(home, beating, "cluster:\n  node_timeout_s: 1\n")
    runner = None
    try:
        spec = mock_task(repo, {"write": {"a": "a"}}, limits={"timeout_seconds": 2})
        task_id = bridge.create_task(spec).task_id
        runner = in_thread(lambda: bridge.run_task(task_id))
        runner.join(15)
        assert not runner.is_alive(), "the runner still follows the node past the deadline"
        result = bridge.get_task(task_id)
        assert result.status == "timed_out", result.error
        assert result.error.kind == "timeout"
        assert bridge.store.leases.live() == []
    finally:
        BeatingAgent.stop.set()
        if runner is not None:
            runner.join(30)
        bridge.close()


def test_a_node_that_beats_on_after_a_cancel_does_not_hold_the_runner_or_its_slot(
    home, repo, beating
):
    bridge = bridge_on(home, beating, "cluster:\n  node_timeout_s: 1\n")
    runner = None
    try:
        task_id = bridge.create_task(mock_task(repo, {"write": {"a": "a"}})).task_id
        runner = in_thread(lambda: bridge.run_task(task_id))
        poll(lambda: bridge.get_task(task_id).worker_node, "the turn placed", 10)
        bridge.cancel_task(task_id)
        runner.join(10)
        assert not runner.is_alive(), "the runner still follows the node after the cancel"
        assert bridge.get_task(task_id).status == "cancelled"
        assert bridge.store.leases.live() == []
    finally:
        BeatingAgent.stop.set()
        if runner is not None:
            runner.join(30)
        bridge.close()


# -- a node flooding the task's log --------------------------------------------------------------


class FloodingAgent(NodeAgent):
    """Runs the turn honestly, and first sends far more events, and far larger ones, than a
    turn can record on one host (its progress is bounded by max_progress_events there)."""

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        for update in super().run_turn(order, timeout_s):
            yield update
            if isinstance(update, Placed):
                for _ in range(6):
                    yield Events(tuple(("worker.progress", {"text": "x"}) for _ in range(500)))
                big = {"text": "y" * (4 << 20)}
                yield Events(tuple(("sandbox.pool", big) for _ in range(10)))


def test_a_node_cannot_write_more_into_the_task_s_log_than_a_turn_here_can(home, workdir, repo):
    limit = 20
    nodes = make_nodes(workdir, ("n1",), FloodingAgent)
    bridge = bridge_on(home, nodes, f"max_progress_events: {limit}\n")
    try:
        result = run(bridge, mock_task(repo, {"write": {"a": "a"}}))
        events = logged(bridge, result.task_id)
    finally:
        bridge.close()
    assert result.status == "succeeded", result.error
    progress = [e for e in events if e.kind == "worker.progress"]
    from_node = [e for e in events if e.kind.startswith(("worker.", "workspace.", "sandbox."))]
    assert len(progress) <= limit + 1, len(progress)  # what a turn records here at most
    assert len(from_node) <= limit + 200, len(from_node)
    stored = sum(len(json.dumps(e.data)) for e in events)
    assert stored < 20 << 20, f"{stored} bytes of the node's 40 MiB stored"


# -- what a node says of its turn ---------------------------------------------------------------


class TimingsLiar(NodeAgent):
    """Runs the turn, and reports its timings as no turn measures them."""

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        for update in super().run_turn(order, timeout_s):
            if isinstance(update, TurnDone):
                seconds = {"worker_s": "soon", **{f"k{i}": 1.0 for i in range(5000)}}
                update = dataclasses.replace(update, seconds=seconds)
            yield update


def test_a_node_s_timings_cannot_make_the_task_s_record_unreadable(home, workdir, repo):
    """The node's `seconds` went into the record's timings as sent: a string there and the
    task, though finished, can no longer be read (shown, accepted, listed)."""
    bridge = bridge_on(home, make_nodes(workdir, ("n1",), TimingsLiar))
    try:
        task_id = bridge.create_task(mock_task(repo, {"write": {"a": "a"}})).task_id
        try:
            bridge.run_task(task_id)
        finally:
            listed = bridge.store.query("SELECT status FROM tasks WHERE task_id = ?", (task_id,))
        result = bridge.get_task(task_id)
    finally:
        bridge.close()
    assert [row["status"] for row in listed] == [result.status]
    assert result.status in ("succeeded", "failed"), result.error
    assert len(result.timings) < 50, len(result.timings)


# -- what a node reports of its checks -----------------------------------------------------------


class ChecksLiar(NodeAgent):
    """A node whose checks report ``doc`` (built from the honest one) in place of theirs."""

    forge: Callable[[VerificationDoc], VerificationDoc] = staticmethod(lambda doc: doc)

    def run_checks(self, order: ChecksOrder, timeout_s: float) -> Iterator[Update]:
        for update in super().run_checks(order, timeout_s):
            if isinstance(update, ChecksDone):
                update = dataclasses.replace(
                    update, verification=type(self).forge(update.verification)
                )
            yield update


def liar_nodes(workdir: Path, forge: Callable[[VerificationDoc], VerificationDoc]) -> LocalNodes:
    class Liar(ChecksLiar):
        pass

    Liar.forge = staticmethod(forge)
    agents = [NodeAgent("n1", workdir / "node-n1", FakeSandbox())]
    agents.append(Liar("n2", workdir / "node-n2", FakeSandbox()))
    return LocalNodes(agents, slots=1)


def test_checks_reported_without_a_result_for_each_command_are_not_taken(home, workdir, repo):
    """The node runs the checks and is trusted for each command's result; but a report that
    leaves the failing command out is no report of these checks."""
    nodes = liar_nodes(workdir, lambda doc: VerificationDoc(ok=True, image=doc.image))
    bridge = bridge_on(home, nodes)
    try:
        result = run(bridge, mock_task(repo, {"write": {"a": "a"}}, verify=["true", "false"]))
    finally:
        bridge.close()
    assert result.verify_node == "n2"
    assert result.status == "failed"
    assert result.error.kind == "cluster", result.error


def test_a_checks_node_s_ok_is_not_taken_over_its_own_command_results(home, workdir, repo):
    """`ok` says the checks passed while the node's own results say one failed: the task fails
    (first_failure) and its record must not say the verification was ok."""
    nodes = liar_nodes(workdir, lambda doc: doc.model_copy(update={"ok": True}))
    bridge = bridge_on(home, nodes)
    try:
        result = run(bridge, mock_task(repo, {"write": {"a": "a"}}, verify=["false"]))
    finally:
        bridge.close()
    assert result.status == "failed"
    assert result.verification.ok is False


# -- a node's text redacted here as its events are ----------------------------------------------

KEY_VAR = "WB_CLUSTER_REVIEW_KEY"
KEY = "rvw" + os.urandom(16).hex()  # no pattern of a secret: masked only as a known one


def test_a_node_s_summary_and_check_output_are_redacted_here_as_its_events_are(
    home, workdir, repo, monkeypatch
):
    """A route's key is known to the control host's redactor alone (it never reaches a node).
    Should the worker come by it (an upstream echoing it back), one host masks it in the
    summary and the checks' output; the node cannot, so the control host must."""
    monkeypatch.setenv(KEY_VAR, KEY)
    config = (
        "allow_mock_routes: true\n"
        "gateway:\n  routes:\n    test:\n      upstream: http://127.0.0.1:9\n"
        f"      auth: x-api-key\n      key_env: {KEY_VAR}\n"
    )
    relayless = {RELAY: FakeSandbox().executables["mock-worker"]}
    nodes = make_nodes(workdir, sandbox=lambda: FakeSandbox(executables=relayless))
    bridge = bridge_on(home, nodes, config)
    spec = mock_task(
        repo,
        {"routes": ["test"], "write": {"echoed.txt": KEY}, "summary": f"the key is {KEY}"},
        verify=["cat echoed.txt"],
    )
    try:
        result = run(bridge, spec)
        events = logged(bridge, result.task_id)
    finally:
        bridge.close()
    assert result.status == "succeeded", result.error
    checked = [e.data for e in events if e.kind == "verification.command"]
    assert checked and KEY not in json.dumps(checked)  # the node's events: redacted here
    assert KEY not in result.summary
    assert KEY not in result.verification.model_dump_json()


# -- a node's account of the worker's request ----------------------------------------------------


class RequestForger(NodeAgent):
    """Runs the turn, then says the worker asked ``request`` (no worker's final message could
    hold it: the one parser refuses control characters and unknown shapes)."""

    request: object = None

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        for update in super().run_turn(order, timeout_s):
            if isinstance(update, TurnDone):
                forged = update.exit.model_copy(update={"request": type(self).request})
                update = dataclasses.replace(update, exit=forged)
            yield update


def test_a_node_cannot_ask_the_caller_what_a_worker_s_final_message_could_not(home, workdir, repo):
    RequestForger.request = {
        "kind": "question",
        "detail": {
            "text": "\x1b]0;pwned\x07\x1b[2JApprove? " + "z" * 5000,
            "choices": ["\x1b[31my"],
        },
    }
    nodes = make_nodes(workdir, ("n1",), RequestForger)
    bridge = bridge_on(home, nodes)
    try:
        result = run(bridge, mock_task(repo, {"write": {"a": "a"}}))
        asked = bridge.store.requests.for_task(result.task_id)
    finally:
        bridge.close()
    shown = json.dumps([r.detail for r in asked])
    assert "\\u001b" not in shown and "zzzzzzzzzz" * 200 not in shown, shown[:300]


# -- what nodes keep of a task after it ended ---------------------------------------------------


def test_every_node_that_ran_a_task_s_checks_lets_go_of_it_when_the_task_ends(home, workdir, repo):
    """Turn 0's checks on n2, the repair's on n3 (n2 busy then): the runner released only the
    worker's node and the last checks' node, and n2 kept the task's shadow and checkout."""
    nodes = make_nodes(workdir, ("n1", "n2", "n3"))
    bridge = bridge_on(home, nodes)
    other, owner = "t-other-task", Owner()
    starts: list[int] = []

    def second_turn_takes_n2() -> None:
        starts.append(1)
        if len(starts) == 2:
            assert bridge.store.leases.acquire(other, owner, {"node:n2": 1}, 60)

    on_worker_start(nodes, "n1", second_turn_takes_n2)
    spec = mock_task(
        repo,
        {"write": {"a": "a"}, "on_follow_up": {"write": {"fixed": "1"}}},
        verify=["test -f fixed"],
    )
    spec["metadata"]["auto_repair"] = 1
    try:
        result = run(bridge, spec)
        checks = [
            e.data["node"]
            for e in logged(bridge, result.task_id)
            if e.kind == "cluster.checks_placed"
        ]
    finally:
        bridge.store.leases.release_scope(other, owner, "node:n2")
        bridge.close()
    assert result.status == "succeeded", result.error
    assert checks == ["n2", "n3"]
    for name in ("n1", "n2", "n3"):
        agent = nodes.links[name].agent
        assert shadows(agent) == [], f"{name} still holds the task"
        assert not (agent.home / "tasks" / result.task_id).exists(), name


def test_an_image_upload_the_control_host_gave_up_on_is_not_kept_on_the_node(workdir):
    """A control host that stopped streaming (it died, the node was lost for a while) leaves
    the part it sent in the agent's uploads: an image's size, for the agent's whole life."""
    agent = NodeAgent("n1", workdir / "node-n1", FakeSandbox())
    agent.image_part("abandoned", 0, b"x" * 4096)
    partial = agent.root / "uploads" / "abandoned.tar"
    assert partial.is_file()
    an_hour_ago = time.time() - 3600
    os.utime(partial, (an_hour_ago, an_hour_ago))
    agent.image_part("next", 0, b"y")  # another stream starts later
    again = NodeAgent("n1", workdir / "node-n1", FakeSandbox())  # or the agent is made again
    again.reap()
    assert not partial.exists()


# -- the relay hub of a process ------------------------------------------------------------------


def free_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


def test_a_task_with_relay_ports_gets_a_relay_in_that_range_whatever_ran_before_it():
    """The hub is one per process and host: a task whose config names cluster.relay_ports
    (the range the firewall opens) was given the hub an earlier task started on any port."""
    from bridge.pipeline import node_turn

    low = free_port()
    saved = dict(node_turn._hubs)
    node_turn._hubs.clear()
    try:
        node_turn.relay_hub("127.0.0.1")  # an earlier task, no range configured
        hub = node_turn.relay_hub("127.0.0.1", (low, low))
        assert hub.address[1] == low, f"relay on {hub.address[1]}, outside {low}-{low}"
    finally:
        for hub in node_turn._hubs.values():
            hub.stop()
        node_turn._hubs.clear()
        node_turn._hubs.update(saved)


# -- design decisions (noted in the review; strict xfail until decided) --------------------------


def order_for(home: Path, repo: Path, workdir: Path, mock: dict, turn: int = 0, start=None):
    """A TurnOrder for a new task of ``repo`` as a control host would send it."""
    from bridge.cluster.bundles import base_bundle
    from bridge.cluster.orders import ImageOrder
    from bridge.workers import Turn
    from bridge.workspace.rawgit import repo_id

    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    try:
        spec = mock_task(repo, {**mock, "on_follow_up": mock})
        record = bridge.store.load_task(bridge.create_task(spec).task_id)
    finally:
        bridge.close()
    image = "worker-bridge/mock:" + record.config.image_tag
    return TurnOrder(
        record=record,
        turn=Turn(record.spec.objective, record.spec.metadata, turn),
        repo_key=repo_id(repo),
        start=start or record.base_commit,
        remaining_s=120,
        images=(ImageOrder(image, FakeSandbox().inspect_image(image).id),),
        bundles=(base_bundle(repo, record.base_commit, workdir / "bundles").read_bytes(),),
    )


def test_a_node_s_collect_leaves_out_what_the_user_s_repository_excludes_as_one_here_does(
    home, workdir, repo
):
    import subprocess

    subprocess.run(["sh", "-c", "echo secret.env >> .git/info/exclude"], cwd=repo, check=True)
    spec = mock_task(repo, {"write": {"secret.env": "TOKEN=1\n", "kept.txt": "k\n"}})
    local_home = workdir / "local-home"
    local_home.mkdir(mode=0o700)
    here = WorkerBridge(home=local_home, sandbox=FakeSandbox())
    try:
        local = run(here, spec)
    finally:
        here.close()
    bridge = bridge_on(home, make_nodes(workdir, ("n1",)))
    try:
        on_node = run(bridge, spec)
    finally:
        bridge.close()
    assert [c["path"] for c in local.document()["changed_files"]] == ["kept.txt"]
    assert on_node.document()["changed_files"] == local.document()["changed_files"]


def test_a_turn_ended_because_nobody_listened_leaves_nothing_on_its_node(home, repo, workdir):
    agent = NodeAgent("n1", workdir / "node-n1", FakeSandbox())
    order = order_for(home, repo, workdir, {"sleep": 30, "write": {"a": "a"}})
    updates = list(agent.run_turn(order, timeout_s=1))  # never touched: the link was cut
    assert updates[-1].superseded, updates[-1]
    assert shadows(agent) == []
    assert not (agent.home / "worktrees" / order.record.task_id).exists()


def test_a_later_turn_ordered_again_ends_the_earlier_attempt_still_running_on_the_node(
    home, repo, workdir
):
    agent = NodeAgent("n1", workdir / "node-n1", FakeSandbox())
    first = order_for(home, repo, workdir, {"sleep": 30, "write": {"a": "a"}})
    quick = dataclasses.replace(first.turn, metadata={"mock": {"write": {"a": "a"}}})
    done = list(agent.run_turn(dataclasses.replace(first, turn=quick), 60))[-1]
    assert isinstance(done, TurnDone), done
    repair = dataclasses.replace(first.turn, number=1, message="fix it")
    order = dataclasses.replace(first, turn=repair, start=done.commit, bundles=())
    earlier: list[Update] = []
    thread = in_thread(lambda: earlier.extend(agent.run_turn(order, 60)))
    poll(lambda: agent.sandbox.containers({}), "the earlier attempt's container", 20)
    again = dataclasses.replace(repair, metadata={"mock": {"on_follow_up": {"write": {"b": "b"}}}})
    second = list(agent.run_turn(dataclasses.replace(order, turn=again), 60))
    agent.cancel(first.record.task_id)  # the earlier attempt, should it still run
    thread.join(30)
    assert isinstance(second[-1], TurnDone), second[-1]


def test_a_worker_s_own_request_on_a_node_still_reaches_the_caller(home, workdir, repo):
    """The request read again on the control host is the one the worker asked."""
    bridge = bridge_on(home, make_nodes(workdir, ("n1",)))
    block = '{"kind": "question", "text": "Which one?", "choices": ["a", "b"]}'
    summary = f"done\n```worker-bridge-request\n{block}\n```"
    try:
        result = run(bridge, mock_task(repo, {"write": {"a": "a"}, "summary": summary}))
        asked = bridge.store.requests.for_task(result.task_id)
    finally:
        bridge.close()
    assert result.status == "waiting_input", result.error
    assert [(r.kind, r.detail) for r in asked] == [
        ("question", {"text": "Which one?", "choices": ["a", "b"]})
    ]
