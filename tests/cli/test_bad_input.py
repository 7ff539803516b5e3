"""Bad input: each mistake gets one line on stderr and the right exit code, and leaves nothing
behind: no task (or one cleanly `failed` when it broke at start), no task branch, no worktree,
no container."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.repos import git, make_repo
from support.tasks import mock_task, write_spec

TASK_ID = re.compile(r"^[0-9a-f]{12}$")


def run_args(repo: Path, *extra: str, command: str = "run", worker: str = "mock") -> list[str]:
    return ["tasks", command, "--repo", str(repo), "--objective", "x", "--worker", worker, *extra]


def the_error_line(result, code: int, *mentions: str) -> str:
    """The one stderr line of a failed command, checked for its exit code and what it names."""
    assert result.code == code, (result.code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("worker-bridge:"), line
    for text in mentions:
        assert text in line, line
    return line


def names_key(line: str, key: str) -> bool:
    """``key`` appears as a whole name (so 'objectiv' is not found inside '--objective')."""
    return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", line) is not None


def labelled_containers(home: Path) -> list:
    import docker

    from bridge.sandbox import home_id

    client = docker.from_env()
    try:
        label = f"io.worker-bridge.home={home_id(home)}"
        return client.containers.list(all=True, filters={"label": label})
    finally:
        client.close()


def assert_repo_untouched(repo: Path, home: Path) -> None:
    assert git(repo, "branch", "--list", "worker-bridge/*") == ""
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    worktrees = home / "worktrees"
    assert not worktrees.exists() or not any(worktrees.iterdir())


def assert_nothing_left(
    cli, home: Path, repo: Path, *, failed_at_start: bool = False
) -> list[dict]:
    """No task (or only tasks that failed cleanly at start), no branch, worktree or container."""
    listed = cli("tasks", "list", "--json")
    assert listed.code == 0, listed.stderr
    tasks = listed.json()["tasks"]
    if failed_at_start:
        for task in tasks:
            assert task["status"] == "failed", task
            assert task["error"] and task["error"]["message"], task
    else:
        assert tasks == []
    assert_repo_untouched(repo, home)
    assert labelled_containers(home) == []
    return tasks


# -- the spec ---------------------------------------------------------------------------------


def test_a_spec_with_a_relative_repository_is_rejected_as_relative(
    cli, home, repo, workdir, docker_images
):
    spec = write_spec(workdir / "spec.json", mock_task(Path("repo"), {}))

    result = cli("tasks", "run", "--spec", str(spec))

    line = the_error_line(result, 2)
    assert "relative" in line.lower()
    assert_nothing_left(cli, home, repo)


def test_a_missing_repository_path_is_rejected(cli, home, repo, workdir, docker_images):
    missing = workdir / "no-such-repo"

    result = cli(*run_args(missing))

    the_error_line(result, 2, str(missing))
    assert not missing.exists()
    assert_nothing_left(cli, home, repo)


def test_a_directory_that_is_not_a_git_work_tree_is_rejected(
    cli, home, repo, workdir, docker_images
):
    plain = workdir / "plain"
    plain.mkdir()

    result = cli(*run_args(plain))

    line = the_error_line(result, 2, str(plain))
    assert "git" in line
    assert list(plain.iterdir()) == []
    assert_nothing_left(cli, home, repo)


def test_an_unresolvable_base_ref_is_rejected_naming_the_ref(cli, home, repo, docker_images):
    result = cli(*run_args(repo, "--base-ref", "no-such-branch"))

    line = the_error_line(result, 2)
    assert names_key(line, "no-such-branch"), line
    assert_nothing_left(cli, home, repo)


@pytest.mark.parametrize(
    ("key", "edit"),
    [
        ("objectiv", lambda spec: spec.update(objectiv=spec.pop("objective"))),
        ("priorty", lambda spec: spec.update(priorty=10)),
        ("verification.comands", lambda spec: spec["verification"].update(comands=["true"])),
    ],
    ids=["top-level-typo-of-objective", "top-level-extra-key", "nested-key"],
)
def test_an_unknown_key_in_the_spec_is_rejected_naming_the_key(
    cli, home, repo, workdir, docker_images, key, edit
):
    spec = mock_task(repo, {})
    edit(spec)

    result = cli("tasks", "run", "--spec", str(write_spec(workdir / "spec.json", spec)))

    line = the_error_line(result, 2)
    assert names_key(line, key), line
    assert_nothing_left(cli, home, repo)


def test_an_unknown_worker_is_rejected_naming_it(cli, home, repo, docker_images):
    result = cli(*run_args(repo, worker="no-such-agent"))

    line = the_error_line(result, 2)
    assert names_key(line, "no-such-agent"), line
    assert_nothing_left(cli, home, repo)


@pytest.mark.parametrize(
    ("content", "mention"),
    [('{"objective": "x", ', "JSON"), (None, "does not exist")],
    ids=["invalid-json", "missing-file"],
)
def test_a_spec_file_that_is_not_json_or_is_missing_is_rejected(
    cli, home, repo, workdir, docker_images, content, mention
):
    spec = workdir / "spec.json"
    if content is not None:
        spec.write_text(content)

    result = cli("tasks", "run", "--spec", str(spec))

    the_error_line(result, 2, str(spec), mention)
    assert_nothing_left(cli, home, repo)


# -- configuration ----------------------------------------------------------------------------


def test_an_unknown_key_in_config_yaml_is_rejected_naming_the_key(cli, home, repo, docker_images):
    config = home / "config.yaml"
    config.write_text("max_concurency: 2\n")

    result = cli(*run_args(repo, "--verify", "true"))

    line = the_error_line(result, 2)
    assert names_key(line, "max_concurency"), line
    assert not (home / "bridge.db").exists()
    config.unlink()
    assert_nothing_left(cli, home, repo)


def test_a_concurrency_override_from_the_environment_that_is_not_a_number_is_rejected(
    cli, home, repo, docker_images
):
    result = cli(*run_args(repo), env={"WORKER_BRIDGE_MAX_CONCURRENCY": "abc"})

    line = the_error_line(result, 2)
    assert "max_concurrency" in line.lower()
    assert_nothing_left(cli, home, repo)


# -- the environment --------------------------------------------------------------------------


def test_a_missing_image_fails_the_task_at_once_naming_the_build_command(
    cli, home, repo, docker_images
):
    env = {"WORKER_BRIDGE_IMAGE_TAG": "does-not-exist"}

    result = cli(*run_args(repo, "--verify", "true"), env=env)

    the_error_line(result, 1, "worker-bridge images build mock")
    tasks = assert_nothing_left(cli, home, repo, failed_at_start=True)
    for task in tasks:
        assert task["error"]["kind"] == "sandbox", task
        assert "worker-bridge images build mock" in task["error"]["message"]
        assert task["changed_files"] == []


def test_an_unreachable_engine_fails_the_run_telling_how_to_start_it(
    cli, home, repo, docker_images
):
    result = cli(*run_args(repo), env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})

    line = the_error_line(result, 1)
    assert "docker" in line.lower() and "start" in line.lower(), line
    tasks = assert_nothing_left(cli, home, repo, failed_at_start=True)
    for task in tasks:
        assert task["error"]["kind"] == "sandbox", task


def test_creating_a_task_needs_no_engine(cli, home, repo):
    env = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}

    result = cli(*run_args(repo, command="create"), env=env)

    assert result.code == 0, result.stderr
    task_id = result.stdout.strip()
    assert TASK_ID.match(task_id), result.stdout
    shown = cli("tasks", "show", task_id, "--json")
    assert shown.code == 0, shown.stderr
    assert shown.json()["status"] == "created"
    assert_repo_untouched(repo, home)


@pytest.mark.parametrize("layout", ["state-root-inside-repo", "repo-inside-state-root"])
def test_a_state_root_and_repository_that_contain_each_other_are_rejected(
    cli, home, repo, docker_images, layout
):
    if layout == "state-root-inside-repo":
        state_root = repo / ".wb"
    else:
        state_root = home
        inner = home / "inner-repo"
        inner.mkdir()
        git(inner, "init", "-q", "-b", "main")
        git(inner, "commit", "-q", "--allow-empty", "-m", "initial")
        repo = inner
    refs_before = git(repo, "for-each-ref")

    result = cli(*run_args(repo), env={"WORKER_BRIDGE_HOME": str(state_root)})

    assert result.code in (1, 2), (result.code, result.stderr)
    the_error_line(result, result.code, "must not contain each other")
    assert git(repo, "for-each-ref") == refs_before
    assert_repo_untouched(repo, state_root)
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert not (state_root / "bridge.db").exists()
    assert labelled_containers(state_root) == []


# -- the library and --json -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "edit"),
    [
        ("objectiv", lambda spec: spec.update(objectiv=spec.pop("objective"))),
        ("verification.comands", lambda spec: spec["verification"].update(comands=["true"])),
    ],
    ids=["top-level-typo-of-objective", "nested-key"],
)
def test_the_library_raises_invalid_spec_naming_an_unknown_key(bridge, home, repo, key, edit):
    import bridge as bridge_package

    spec = mock_task(repo, {})
    edit(spec)

    with pytest.raises(bridge_package.InvalidSpec) as caught:
        bridge.create_task(spec)

    assert isinstance(caught.value, ValueError)
    assert names_key(str(caught.value), key), str(caught.value)
    assert bridge.list_tasks() == []
    assert_repo_untouched(repo, home)


@pytest.mark.parametrize(
    ("extra", "env"),
    [
        (["--metadata-json", json.dumps({"mock": {"exit_code": 3}})], {}),
        (["--verify", "false"], {}),
        ([], {"WORKER_BRIDGE_IMAGE_TAG": "does-not-exist"}),
    ],
    ids=["worker-exit", "verification-failed", "missing-image"],
)
def test_json_output_of_a_failing_run_is_exactly_one_json_document(
    cli, repo, docker_images, extra, env
):
    result = cli(*run_args(repo, *extra, "--json"), env=env)

    assert result.code == 1, (result.stdout, result.stderr)
    doc = json.loads(result.stdout)
    assert isinstance(doc, dict)
    assert doc["status"] == "failed"
    assert doc["error"]["kind"] in ("worker_exit", "verification_failed", "sandbox")


def test_a_failing_run_with_json_still_explains_itself_in_one_line_on_stderr(
    cli, repo, docker_images
):
    mock = {"exit_code": 3}
    result = cli(*run_args(repo, "--metadata-json", json.dumps({"mock": mock}), "--json"))

    json.loads(result.stdout)
    the_error_line(result, 1, "failed")


def test_a_repository_outside_the_allowed_folders_is_refused_naming_them(cli, repo, workdir):
    allowed = workdir / "allowed"
    allowed.mkdir()
    env = {"WORKER_BRIDGE_REPOSITORIES": json.dumps([str(allowed)])}
    result = cli(*run_args(repo, command="create"), env=env)
    line = the_error_line(result, 2, str(repo), str(allowed), "repositories")
    assert "outside the folders tasks may work in" in line
    inside = make_repo(allowed, "ok")
    created = cli(*run_args(inside, command="create"), env=env)
    assert created.code == 0, created.stderr
