"""`repositories` bounds every operation on a task, not only its creation: a server whose config
names one folder treats a task on a repository elsewhere as absent. Tried the way a token holder
would, with every MCP tool through a real session (stdio, and streamable HTTP with a token), the
CLI and the library, against one finished and one running task of another repository, which
stays exactly as it was."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from support.mcp_http_server import http_client, http_server
from support.mcp_session import call, call_error, delegate, mcp_server, wait_status
from support.repos import commit_all, git, make_repo
from support.tasks import bare_spec, new_job
from support.waiting import poll

from bridge import WorkerBridge

pytestmark = pytest.mark.anyio


@pytest.fixture
def outside(workdir: Path, home: Path, docker_images):
    """Two tasks on a repository outside the folder the server will allow, made by an unscoped
    bridge on the same state root: one succeeded (unaccepted), one still running."""
    repo = make_repo(workdir, "elsewhere")
    unscoped = WorkerBridge(home=home, repositories=[])
    spec = {
        "objective": "outside work",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": ["true"]},
        "metadata": {"mock": {"write": {"SECRET.md": "outside change\n"}}},
    }
    done = unscoped.run_task(unscoped.create_task(spec).task_id)
    assert done.status == "succeeded", done.error
    running = unscoped.create_task({**spec, "metadata": {"mock": {"sleep": 300}}})
    unscoped.start_detached(running.task_id)
    poll(lambda: unscoped.get_task(running.task_id).status == "running", "the sleeper to run")
    state = (git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain"))
    yield repo, done.task_id, running.task_id, state, unscoped
    unscoped.cancel_task(running.task_id)
    unscoped.close()


def _scope_to(home: Path, folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(f"repositories:\n  - {folder}\n")


def _assert_untouched(outside_fixture) -> None:
    repo, done, running, state, unscoped = outside_fixture
    assert (git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain")) == state
    assert not (repo / "SECRET.md").exists(), "nothing was accepted into the repository"
    assert git(repo, "branch", "--list", f"worker-bridge/{done}").strip(), "its branch is kept"
    assert unscoped.get_task(done).status == "succeeded"
    assert unscoped.get_task(running).status == "running", "the running task was not cancelled"
    assert (unscoped.config.home / "worktrees" / done).is_dir(), "prune left its worktree"


async def _every_tool_refuses(client, workdir: Path, outside_fixture) -> None:
    repo, done, running, _, _ = outside_fixture
    unknown = await call_error(client, "worker_status", {"task_id": "nosuchtask00"})
    for task_id in (done, running):
        said = await call_error(client, "worker_status", {"task_id": task_id})
        assert said == unknown.replace("nosuchtask00", task_id), "told apart from an unknown id"
        await call_error(client, "worker_logs", {"task_id": task_id})
        await call_error(client, "worker_cancel", {"task_id": task_id})
        await call_error(client, "worker_accept", {"task_id": task_id, "allow_unverified": True})
        await call_error(client, "worker_follow_up", {"task_id": task_id, "message": "rm -rf"})
    refused = await call_error(
        client, "worker_delegate", {"objective": "x", "repository": str(repo)}
    )
    assert "outside the folders tasks may work in" in refused
    listed = await call(client, "worker_status", {})
    assert {t["task_id"] for t in listed["tasks"]}.isdisjoint({done, running})
    pruned = await call(client, "worker_prune", {"apply": True, "include_unaccepted": True})
    touched = " ".join(f"{a['target']} {a['task_id']}" for a in pruned["actions"])
    assert done not in touched and running not in touched, pruned


async def test_every_mcp_tool_over_stdio_treats_another_repositorys_task_as_absent(
    workdir, home, outside
):
    allowed = workdir / "allowed"
    _scope_to(home, allowed)
    mine = make_repo(allowed, "mine")
    async with mcp_server(home) as client:
        await _every_tool_refuses(client, workdir, outside)
        own = await delegate(client, mine, {"write": {"a.txt": "a\n"}}, verify=["true"])
        assert (await wait_status(client, own["task_id"]))["status"] == "succeeded"
        listed = await call(client, "worker_status", {})
        assert own["task_id"] in {t["task_id"] for t in listed["tasks"]}, "its own are listed"
        routed = await call_error(
            client,
            "worker_delegate",
            {
                "objective": "x",
                "repository": str(mine),
                "metadata": {"mock": {"routes": ["openai"]}},
            },
        )
        assert "allow_mock_routes" in routed, "an MCP caller's mock gets no keyed route"
    _assert_untouched(outside)


async def test_every_mcp_tool_over_http_treats_another_repositorys_task_as_absent(
    workdir, home, outside
):
    _scope_to(home, workdir / "allowed")
    token = secrets.token_hex(24)
    with http_server(home, env={"WORKER_BRIDGE_MCP_TOKEN": token}) as server:
        async with http_client(server.url, token) as client:
            await _every_tool_refuses(client, workdir, outside)
    _assert_untouched(outside)


def test_the_cli_and_the_library_treat_another_repositorys_task_as_absent(
    workdir, home, cli, outside
):
    _, done, running, _, _ = outside
    _scope_to(home, workdir / "allowed")
    for task_id in (done, running):
        for verb in (
            ["show", task_id],
            ["logs", task_id],
            ["cancel", task_id],
            ["accept", task_id],
            ["reject", task_id],
            ["follow-up", task_id, "more"],
        ):
            res = cli("tasks", *verb)
            assert res.code == 2, (verb, res.stdout, res.stderr)
            assert f"No task '{task_id}'" in res.stderr, (verb, res.stderr)
    listed = cli("tasks", "list", "--json").json()["tasks"]
    assert {t["task_id"] for t in listed}.isdisjoint({done, running})
    pruned = cli("workspaces", "prune", "--apply", "--include-unaccepted", "--json").json()
    assert done not in str(pruned) and running not in str(pruned), pruned

    scoped = WorkerBridge(home=home)
    try:
        from bridge.errors import TaskNotFound

        for verb in (scoped.get_task, scoped.accept_task, scoped.cancel_task, scoped.task_logs):
            with pytest.raises(TaskNotFound):
                verb(done)
        with pytest.raises(TaskNotFound):
            scoped.follow_up(done, "more")
    finally:
        scoped.close()
    _assert_untouched(outside)


def test_an_idempotency_key_of_another_repositorys_task_reveals_nothing(workdir, home, outside):
    repo, done, _, _, unscoped = outside
    key = "shared-key"
    unscoped.store.update_task(done, idempotency_key=key)
    allowed = workdir / "allowed"
    _scope_to(home, allowed)
    mine = make_repo(allowed, "mine")
    scoped = WorkerBridge(home=home)
    try:
        spec = bare_spec(mine, idempotency_key=key)
        first = scoped.create_task(spec)
        assert first.task_id != done, "a key is its repository's: no other task is named"
        assert scoped.create_task(spec).task_id == first.task_id, "and idempotent within it"
    finally:
        scoped.close()


# -- images a spec may name ---------------------------------------------------------------------


@pytest.fixture
def secret_image(docker_images):
    """An image the engine has but no task may use (a CI image with secrets baked in), made by
    tagging the mock image; removed afterwards."""
    import docker

    client = docker.from_env()
    tag = f"wb-secret-ci:{secrets.token_hex(4)}"
    client.images.get(docker_images.image_for("mock")).tag(tag)
    yield tag
    client.images.remove(tag)
    client.close()


async def test_a_spec_names_only_allowed_images_and_a_refusal_tells_nothing_of_the_engine(
    workdir, home, repo, secret_image, docker_images
):
    from bridge.sandbox import home_id

    other_setup = f"worker-bridge-env:{'0' * 32}-{home_id(workdir / 'another-home')}"
    async with mcp_server(home) as client:
        said = {}
        for name, image in [
            ("present", secret_image),
            ("absent", "wb-secret-ci:not-there"),
            ("other state root", other_setup),
        ]:
            said[name] = await call_error(
                client,
                "worker_delegate",
                {"objective": "x", "repository": str(repo), "environment": {"image": image}},
            )
            assert "allowed_images" in said[name] and image in said[name], said[name]
        assert said["present"].replace(secret_image, "X") == said["absent"].replace(
            "wb-secret-ci:not-there", "X"
        ), "the same words whether the engine has the image or not"
        (repo / ".devcontainer").mkdir()
        (repo / ".devcontainer" / "devcontainer.json").write_text(f'{{"image": "{secret_image}"}}')
        commit_all(repo, "a devcontainer naming the secret image")
        through_repo = await call_error(
            client,
            "worker_delegate",
            {"objective": "x", "repository": str(repo), "environment": {"devcontainer": True}},
        )
        assert "devcontainer.json's image" in through_repo and "allowed_images" in through_repo
    assert not (home / "bridge.db").exists() or WorkerBridge(home=home).list_tasks() == []

    bridge = WorkerBridge(home=home)
    try:
        from bridge.errors import InvalidSpec

        verification = {"commands": ["cat /etc/secret"], "image": secret_image}
        spec = bare_spec(repo, verification=verification)
        with pytest.raises(InvalidSpec, match="verification.image .*allowed_images"):
            bridge.create_task(spec)
        own = {
            **spec,
            "verification": {"commands": ["true"], "image": docker_images.verify_image_ref},
        }
        assert bridge.create_task(own).status == "created", "this state root's own images are fine"
    finally:
        bridge.close()
    allowing = WorkerBridge(home=home, allowed_images=["wb-secret-ci:*"])
    try:
        assert allowing.create_task(spec).status == "created", "the owner may allow it"
    finally:
        allowing.close()


def test_the_event_feed_shows_a_jobs_events_only_inside_the_scope(workdir, home):
    """`events_since` (the web view's feed) is bounded like every verb: a job's events show when
    its repository is inside `repositories`, and never when it is outside."""
    inside, elsewhere = workdir / "inside", workdir / "elsewhere"
    inside.mkdir()
    elsewhere.mkdir()
    bridge = WorkerBridge(home=home, repositories=[str(inside)])
    try:
        for job_id, repository in (("job-in", inside), ("job-out", elsewhere)):
            job = new_job(job_id, repository=str(repository))
            bridge.store.jobs.insert(job, {"kind": "compete"})
        shown = {e.task_id for e in bridge.events_since(0).events}
    finally:
        bridge.close()
    assert shown == {"job-in"}
