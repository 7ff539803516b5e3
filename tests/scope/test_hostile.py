"""What a task may touch, attacked (adopted from the hostile review of issue 18's change): a
malicious MCP client (a token holder of a server scoped to one folder) spells a repository
outside the folder another way (a name that extends the folder's, a link, a climb, a repository
swapped for a link after creation) or probes another repository's idempotency keys; a spec names
a secret image by another spelling or builds a devcontainer from it; and a task made while the
owner allowed mock routes or an image is refused a follow-up (or accept) once the owner no
longer does. Through the library, with the fake sandbox where nothing needs to run; the images
and follow-ups through the real engine."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest
from support.repos import commit_all, make_repo
from support.tasks import bare_spec, mock_task

from bridge import WorkerBridge
from bridge.config.settings import load_config
from bridge.errors import InvalidSpec, TaskNotFound
from bridge.sandbox.fake import FakeSandbox
from bridge.scope import image_allowed


def _bridge(home: Path, **overrides) -> WorkerBridge:
    return WorkerBridge(home=home, sandbox=FakeSandbox(), **overrides)


def _allowed_and_outside(workdir: Path) -> tuple[Path, Path]:
    """The one folder a scoped bridge will allow, and a repository outside it."""
    allowed = workdir / "allowed"
    allowed.mkdir()
    return allowed, make_repo(workdir, "outside")


# -- repositories bound every verb --------------------------------------------------------------


def test_a_folder_whose_name_extends_an_allowed_one_is_outside_with_or_without_a_slash(
    workdir, home
):
    allowed = workdir / "repos"
    allowed.mkdir()
    evil = make_repo(workdir, "repos-evil")  # a string prefix match would let it in
    unscoped = _bridge(home, repositories=[])
    task = unscoped.create_task(bare_spec(evil)).task_id
    unscoped.close()
    for spelled in (str(allowed), str(allowed) + "/", str(allowed) + "/."):
        scoped = _bridge(home, repositories=[Path(spelled)])
        try:
            with pytest.raises(InvalidSpec, match="outside the folders"):
                scoped.create_task(bare_spec(evil))
            with pytest.raises(TaskNotFound):
                scoped.get_task(task)
            assert scoped.list_tasks() == []
        finally:
            scoped.close()


def test_a_link_or_a_climb_inside_the_allowed_folder_does_not_reach_a_repository_outside(
    workdir, home
):
    allowed, outside = _allowed_and_outside(workdir)
    (allowed / "link").symlink_to(outside)
    scoped = _bridge(home, repositories=[allowed])
    try:
        for spelled in (allowed / "link", Path(f"{allowed}/../outside")):
            with pytest.raises(InvalidSpec, match="outside the folders"):
                scoped.create_task(bare_spec(spelled))
    finally:
        scoped.close()


def test_a_task_whose_repository_was_swapped_for_a_link_outside_is_absent(workdir, home):
    allowed, outside = _allowed_and_outside(workdir)
    mine = make_repo(allowed, "mine")
    scoped = _bridge(home, repositories=[allowed])
    try:
        task = scoped.create_task(bare_spec(mine)).task_id
        os.rename(mine, workdir / "parked")
        mine.symlink_to(outside)
        with pytest.raises(TaskNotFound):
            scoped.get_task(task)
        with pytest.raises(TaskNotFound):
            scoped.cancel_task(task)
        assert scoped.list_tasks() == []
    finally:
        scoped.close()


def test_an_idempotency_key_used_only_in_another_repository_answers_as_an_unused_key(workdir, home):
    allowed, outside = _allowed_and_outside(workdir)
    mine = make_repo(allowed, "mine")
    unscoped = _bridge(home, repositories=[])
    unscoped.create_task(bare_spec(outside, idempotency_key="JIRA-4711-fix-billing"))
    unscoped.close()
    scoped = _bridge(home, repositories=[allowed])
    try:
        fresh = scoped.create_task(bare_spec(mine, idempotency_key="never-used"))
        assert fresh.status == "created"
        # The oracle: a client probing keys learns which another tenant used (and cannot use
        # them itself) unless this answers like the unused key above.
        probed = scoped.create_task(bare_spec(mine, idempotency_key="JIRA-4711-fix-billing"))
        assert probed.status == "created"
    finally:
        scoped.close()


# -- images a spec may name ---------------------------------------------------------------------


def test_an_image_spelled_another_way_than_an_allowed_pattern_is_refused(home, docker_images):
    import docker

    config = load_config({"WORKER_BRIDGE_HOME": str(home)}).model_copy(
        update={"allowed_images": ["python:*"]}
    )
    mock = docker_images.image_for("mock")
    client = docker.from_env()
    secret = f"wb-review-secret:{secrets.token_hex(4)}"
    client.images.get(mock).tag(secret)
    try:
        image_id = client.images.get(secret).id  # sha256:...
        refused = [
            secret,
            f"docker.io/library/{secret}",
            image_id,
            image_id.removeprefix("sha256:"),
            image_id.removeprefix("sha256:")[:12],
            f"docker.io/{mock}",
            mock.upper(),
            f"{mock}@{image_id}",
        ]
        assert not [ref for ref in refused if image_allowed(config, ref)]
        assert image_allowed(config, mock) and image_allowed(config, "python:3.12")
        # An allowed name carrying the secret image's id as its digest: the engine does not
        # resolve it to the secret image (it looks the digest up under that name only).
        for ref in (f"python:3.12@{image_id}", f"{mock}@{image_id}"):
            with pytest.raises(docker.errors.ImageNotFound):
                client.images.get(ref)
    finally:
        client.images.remove(secret)
        client.close()


@pytest.mark.parametrize(
    ("dockerfile", "args"),
    [
        ("FROM wb-review-secret:1\nRUN cat /secret.txt\n", {}),
        ("ARG BASE=wb-review-secret:1\nFROM ${BASE}\n", {}),
        ("ARG BASE\nFROM ${BASE}\n", {"BASE": "wb-review-secret:1"}),
        ("FROM worker-bridge/verify:0.1.0\nCOPY --from=wb-review-secret:1 /secret.txt /\n", {}),
    ],
    ids=["from", "arg-default", "build-arg", "copy-from"],
)
def test_a_devcontainer_build_from_an_image_not_allowed_is_refused_at_creation(
    workdir, home, repo, dockerfile, args
):
    (repo / ".devcontainer").mkdir()
    build = {"dockerfile": "Dockerfile", **({"args": args} if args else {})}
    (repo / ".devcontainer" / "devcontainer.json").write_text(json.dumps({"build": build}))
    (repo / ".devcontainer" / "Dockerfile").write_text(dockerfile)
    commit_all(repo, "a devcontainer built from another image")
    bridge = _bridge(home)
    try:
        with pytest.raises(InvalidSpec, match="allowed_images"):
            bridge.create_task(
                bare_spec(
                    repo, environment={"devcontainer": True}, verification={"commands": ["true"]}
                )
            )
    finally:
        bridge.close()


# -- permissions the owner withdrew -------------------------------------------------------------


def test_a_follow_up_on_a_mock_task_made_while_routes_were_allowed_is_refused_once_they_are_not(
    workdir, home, repo, upstream, docker_images
):
    routes = f"gateway:\n  routes:\n    test:\n      upstream: {upstream.url}\n"
    (home / "config.yaml").write_text("allow_mock_routes: true\n" + routes)
    probe = "env | grep '^WB_ROUTE_' | cut -d= -f1; echo routes-probed"
    mock = {"routes": ["test"], "write": {"a.txt": "a\n"}, "on_follow_up": {"script": probe}}
    allowing = WorkerBridge(home=home)
    try:
        task = allowing.create_task(mock_task(repo, mock, verify=["true"])).task_id
        assert allowing.run_task(task).status == "succeeded"
    finally:
        allowing.close()
    (home / "config.yaml").write_text(routes)  # the owner turns mock routes off
    bridge = WorkerBridge(home=home)
    try:
        with pytest.raises(InvalidSpec, match="allow_mock_routes"):
            bridge.follow_up(task, "again")
        assert bridge.get_task(task).status == "succeeded", "no turn was queued"
    finally:
        bridge.close()


def test_a_follow_up_on_a_task_whose_image_is_no_longer_allowed_is_refused(
    workdir, home, repo, docker_images
):
    import docker

    client = docker.from_env()
    image = f"wb-review-env:{secrets.token_hex(4)}"
    client.images.get(docker_images.image_for("mock")).tag(image)
    try:
        (home / "config.yaml").write_text(f"allowed_images: ['{image}']\n")
        spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["true"])
        spec["environment"] = {"image": image}
        allowing = WorkerBridge(home=home)
        try:
            task = allowing.create_task(spec).task_id
            assert allowing.run_task(task).status == "succeeded"
        finally:
            allowing.close()
        (home / "config.yaml").write_text("allowed_images: []\n")  # the owner narrows it
        bridge = WorkerBridge(home=home)
        try:
            with pytest.raises(InvalidSpec, match="allowed_images"):
                bridge.follow_up(task, "again")
            with pytest.raises(InvalidSpec, match="allowed_images"):
                bridge.accept_task(task)
        finally:
            bridge.close()
    finally:
        client.images.remove(image)
        client.close()
