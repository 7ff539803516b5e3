"""Tasks through the cluster's executor with node agents in this process (no engine, no Ray):
each node a state root of its own and a fake sandbox of its own, the control host a third. Real
git, SQLite and bundles; the snapshot comes back only through `receive_snapshot`."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.repos import git
from support.tasks import mock_task
from support.waiting import poll

from bridge import WorkerBridge
from bridge.cluster.orders import ChecksDone
from bridge.pipeline.node_agent import NodeAgent
from bridge.pipeline.nodes import LocalNodes
from bridge.sandbox.fake import FakeSandbox


@pytest.fixture
def nodes(workdir: Path) -> LocalNodes:
    agents = []
    for name in ("n1", "n2"):
        home = workdir / f"node-{name}"
        agents.append(NodeAgent(name, home, FakeSandbox()))
    return LocalNodes(agents, slots=1)


@pytest.fixture
def on_cluster(home: Path, nodes: LocalNodes):
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox(), nodes=nodes)
    yield bridge
    bridge.close()


def run(bridge: WorkerBridge, spec: dict):
    return bridge.run_task(bridge.create_task(spec).task_id)


def kinds(bridge: WorkerBridge, task_id: str) -> list[str]:
    return [e.kind for e in bridge.task_logs(task_id, limit=10_000).events]


def test_a_task_runs_on_a_node_and_its_diff_equals_the_same_task_run_here(
    on_cluster, nodes, repo, workdir
):
    spec = mock_task(
        repo,
        {"write": {"new.py": "X = 1\n", "calc.py": "def add(a, b):\n    return a - b\n"}},
        verify=["test -f new.py", "true"],
    )
    result = run(on_cluster, spec)
    assert result.status == "succeeded", result.error
    assert result.worker_node in ("n1", "n2")
    assert git(repo, "show", f"{result.branch}:new.py") == "X = 1\n"
    events = kinds(on_cluster, result.task_id)
    assert "cluster.placed" in events and "worker.progress" in events
    assert "worker.completed" in events

    local_home = workdir / "local-home"
    local_home.mkdir(mode=0o700)
    here = WorkerBridge(home=local_home, sandbox=FakeSandbox())
    local = run(here, spec)
    here.close()
    assert local.status == "succeeded"
    assert git(repo, "diff", result.base_commit, result.branch) == git(
        repo, "diff", local.base_commit, local.branch
    )
    assert Path(result.artifacts["diff"]).read_bytes() == Path(local.artifacts["diff"]).read_bytes()
    # the node let go of it: no workspace, no shadow
    node = nodes.links[result.worker_node].agent
    assert not (node.home / "worktrees" / result.task_id).exists()
    assert node.store.query("SELECT task_id FROM tasks") == []
    assert on_cluster.store.leases.live() == []


def test_two_tasks_at_once_take_one_slot_of_each_node(on_cluster, repo):
    import threading

    ids = [
        on_cluster.create_task(mock_task(repo, {"sleep": 0.5, "write": {f"f{i}": "x"}})).task_id
        for i in range(2)
    ]
    threads = [threading.Thread(target=on_cluster.run_task, args=(t,)) for t in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results = [on_cluster.get_task(t) for t in ids]
    assert [r.status for r in results] == ["succeeded", "succeeded"], [r.error for r in results]
    assert sorted(r.worker_node for r in results) == ["n1", "n2"]


def test_the_checks_run_on_another_node_than_the_worker_and_fail_as_they_would_here(
    on_cluster, repo
):
    passing = run(on_cluster, mock_task(repo, {"write": {"new.py": "X = 1\n"}}, verify=["true"]))
    assert passing.status == "succeeded", passing.error
    assert {passing.worker_node, passing.verify_node} == {"n1", "n2"}
    failing = run(
        on_cluster, mock_task(repo, {"write": {"new.py": "X = 1\n"}}, verify=["test -f other.py"])
    )
    assert failing.status == "failed"
    assert failing.verification.ok is False
    assert [c.status for c in failing.verification.commands] == ["failed"]
    assert failing.verify_node != failing.worker_node


class TreeLiar(NodeAgent):
    """A node whose checks report another tree than the one it was sent."""

    def run_checks(self, order, timeout_s):
        for update in super().run_checks(order, timeout_s):
            if isinstance(update, ChecksDone):
                update = ChecksDone(update.verification, update.timed_out, "0" * 40)
            yield update


def test_checks_that_report_another_tree_than_the_snapshots_are_not_taken(home, repo, workdir):
    agents = [NodeAgent("n1", workdir / "node-n1", FakeSandbox())]
    agents.append(TreeLiar("n2", workdir / "node-n2", FakeSandbox()))
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox(), nodes=LocalNodes(agents, slots=1))
    try:
        result = run(bridge, mock_task(repo, {"write": {"a": "a"}}, verify=["true"]))
    finally:
        bridge.close()
    assert (result.worker_node, result.verify_node) == ("n1", "n2")
    assert result.status == "failed"
    assert result.error.kind == "cluster" and "not the snapshot's" in result.error.message


def test_relays_take_free_ports_of_the_configured_range_and_say_when_none_is_left():
    import socket

    from bridge.errors import BridgeError
    from bridge.pipeline.node_turn import _started_hub

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    low = probe.getsockname()[1]
    probe.close()
    taken = socket.socket()
    taken.bind(("127.0.0.1", low))  # another process's port, in the range
    taken.listen()
    hubs = []
    try:
        hubs.append(_started_hub("127.0.0.1", (low, low + 1)))
        assert hubs[0].address[1] == low + 1
        with pytest.raises(BridgeError, match=f"Every port of cluster.relay_ports {low}-"):
            _started_hub("127.0.0.1", (low, low + 1))
    finally:
        taken.close()
        for hub in hubs:
            hub.stop()


def test_a_follow_up_of_a_task_that_ran_on_a_node_says_why_it_cannot_be(on_cluster, repo):
    from bridge.errors import TaskStateError

    result = run(on_cluster, mock_task(repo, {"write": {"a": "a"}}))
    assert result.status == "succeeded"
    with pytest.raises(TaskStateError, match=f"ran on the cluster's node {result.worker_node}"):
        on_cluster.follow_up(result.task_id, "more")


def test_a_task_that_ran_on_a_node_is_accepted_into_the_users_branch(on_cluster, repo):
    result = run(on_cluster, mock_task(repo, {"write": {"new.py": "X = 1\n"}}, verify=["true"]))
    assert result.status == "succeeded", result.error
    outcome = on_cluster.accept_task(result.task_id)
    assert outcome.accepted, outcome.reason
    assert (repo / "new.py").read_text() == "X = 1\n"
    assert on_cluster.get_task(result.task_id).status == "accepted"


def test_a_first_turn_ordered_again_ends_the_earlier_attempt_still_running_on_the_node(
    home, repo, workdir
):
    """A runner died mid-turn and another took the task over: its order wins on the node."""
    import threading

    from bridge.cluster.bundles import base_bundle
    from bridge.cluster.orders import ImageOrder, TurnDone, TurnFailed, TurnOrder
    from bridge.workers import Turn
    from bridge.workspace.rawgit import repo_id

    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    try:
        task_id = bridge.create_task(mock_task(repo, {"sleep": 30, "write": {"a": "a"}})).task_id
        record = bridge.store.load_task(task_id)
    finally:
        bridge.close()
    image = "worker-bridge/mock:" + record.config.image_tag
    agent = NodeAgent("n1", workdir / "node-n1", FakeSandbox())
    order = TurnOrder(
        record=record,
        turn=Turn(record.spec.objective, record.spec.metadata, 0),
        repo_key=repo_id(repo),
        start=record.base_commit,
        remaining_s=120,
        images=(ImageOrder(image, FakeSandbox().inspect_image(image).id),),
        bundles=(base_bundle(repo, record.base_commit, workdir / "bundles").read_bytes(),),
    )
    first: list = []
    earlier = threading.Thread(target=lambda: first.extend(agent.run_turn(order, 60)))
    earlier.start()
    poll(lambda: agent.sandbox.containers({}), "the first attempt's container", 20)
    again = Turn(record.spec.objective, {"mock": {"write": {"a": "b"}}}, 0)
    second = list(agent.run_turn(TurnOrder(**{**order.__dict__, "turn": again}), 60))
    earlier.join(30)
    assert not earlier.is_alive()
    assert isinstance(first[-1], TurnFailed) and first[-1].superseded, first[-1]
    assert isinstance(second[-1], TurnDone), second[-1]
    assert agent.sandbox.containers({}) == []


def test_an_agent_that_reaps_also_prunes_what_no_task_of_its_node_references(
    on_cluster, nodes, repo
):
    result = run(on_cluster, mock_task(repo, {"write": {"a": "a"}}))
    assert result.status == "succeeded"
    agent = nodes.links[result.worker_node].agent
    orphan = agent.home / "tasks" / "0123456789ab"  # as a killed agent's half-made task leaves
    (orphan / "home" / "deep").mkdir(parents=True)
    assert agent.reap() == []
    assert not orphan.exists()
