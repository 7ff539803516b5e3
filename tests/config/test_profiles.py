"""Task types with profiles: a type fills only what the caller left unset (flags, spec keys and
library fields always win), the result says what it filled, config adds and overrides types,
an unknown type is refused naming the known ones, and a retry fills anew. Creation needs no
engine; the tasks here are made, not run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.tasks import bare_spec, create_spec, write_spec

from bridge import WorkerBridge
from bridge.errors import InvalidSpec
from bridge.models import TaskSpec, Workspace
from bridge.sandbox.fake import FakeSandbox


@pytest.fixture
def fast(home: Path):
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    yield bridge
    bridge.close()


def stored(bridge: WorkerBridge, task_id: str) -> dict:
    return bridge.store.load_task(task_id).spec_doc


def test_a_type_fills_what_the_spec_left_unset_and_the_result_says_which(fast, repo):
    made = fast.create_task(bare_spec(repo, metadata={"type": "hotfix"}))
    assert made.profile == {
        "type": "hotfix",
        "filled": ["priority", "limits.timeout_seconds", "metadata.auto_repair"],
    }
    spec = stored(fast, made.task_id)
    assert spec["priority"] == 90 and spec["limits"]["timeout_seconds"] == 600
    assert spec["metadata"]["auto_repair"] == 2
    # what runs is what was filled: the deadline of the task's own limits
    assert fast.store.load_task(made.task_id).limits.timeout_seconds == 600


def test_values_the_caller_gave_always_win_over_the_profile(fast, repo):
    spec = bare_spec(
        repo,
        priority=50,  # the spec's default value, given explicitly, is still given
        limits={"timeout_seconds": 77},
        metadata={"type": "hotfix", "auto_repair": 0},
    )
    made = fast.create_task(spec)
    assert made.profile == {"type": "hotfix", "filled": []}
    doc = stored(fast, made.task_id)
    assert (doc["priority"], doc["limits"]["timeout_seconds"]) == (50, 77)
    assert doc["metadata"]["auto_repair"] == 0
    assert spec["limits"] == {"timeout_seconds": 77}, "the caller's dict is left as it was"


def test_a_library_taskspec_counts_only_the_fields_it_set(fast, repo):
    spec = TaskSpec(
        objective="x",
        workspace=Workspace(repository=str(repo)),
        priority=60,
        metadata={"type": "chore"},
    )
    made = fast.create_task(spec)
    assert made.profile == {"type": "chore", "filled": ["limits.timeout_seconds"]}
    assert stored(fast, made.task_id)["priority"] == 60


def test_a_task_without_a_type_has_no_profile_and_feature_fills_nothing(fast, repo):
    assert fast.create_task(bare_spec(repo)).profile is None
    plain = fast.create_task(bare_spec(repo, metadata={"type": "feature"}))
    assert plain.profile == {"type": "feature", "filled": []}
    assert stored(fast, plain.task_id)["priority"] == 50


@pytest.mark.parametrize("kind", ["epic", "", 7, ["chore"]])
def test_an_unknown_type_is_refused_naming_the_known_ones(fast, repo, kind):
    with pytest.raises(InvalidSpec) as refused:
        fast.create_task(bare_spec(repo, metadata={"type": kind}))
    if isinstance(kind, str) and kind:
        assert "chore, feature, hotfix, refactor" in refused.value.message
    assert fast.list_tasks() == [], "nothing is made for a refused spec"


def test_config_adds_types_and_overrides_fields_of_a_built_in_one(home, repo):
    (home / "config.yaml").write_text(
        "profiles:\n  docs: {priority: 10}\n  hotfix: {priority: 99, auto_repair: 0}\n"
    )
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    docs = bridge.create_task(bare_spec(repo, metadata={"type": "docs"}))
    assert docs.profile == {"type": "docs", "filled": ["priority"]}
    hotfix = bridge.create_task(bare_spec(repo, metadata={"type": "hotfix"}))
    # the override's fields win (0 turns the repairs off); the built-in's others stay
    assert hotfix.profile["filled"] == [
        "priority",
        "limits.timeout_seconds",
        "metadata.auto_repair",
    ]
    doc = stored(bridge, hotfix.task_id)
    assert (doc["priority"], doc["limits"]["timeout_seconds"], doc["metadata"]["auto_repair"]) == (
        99,
        600,
        0,
    )
    with pytest.raises(InvalidSpec, match="chore, docs, feature, hotfix, refactor"):
        bridge.create_task(bare_spec(repo, metadata={"type": "epic"}))
    bridge.close()


def test_a_bad_profile_in_config_is_an_error_naming_it(home):
    from bridge.config.settings import load_config
    from bridge.errors import ConfigError

    (home / "config.yaml").write_text("profiles:\n  chore: {priorty: 3}\n")
    with pytest.raises(ConfigError, match="profiles.chore.priorty"):
        load_config(env={"WORKER_BRIDGE_HOME": str(home)})
    (home / "config.yaml").write_text("profiles:\n  'Big Thing': {priority: 3}\n")
    with pytest.raises(ConfigError, match="Big Thing"):
        load_config(env={"WORKER_BRIDGE_HOME": str(home)})


def test_a_retry_fills_the_profile_again_from_the_profile_as_it_is_then(home, repo):
    first = WorkerBridge(home=home, sandbox=FakeSandbox())
    made = first.create_task(bare_spec(repo, priority=70, metadata={"type": "chore"}))
    first.cancel_task(made.task_id)
    first.close()
    (home / "config.yaml").write_text("profiles:\n  chore: {timeout_seconds: 120}\n")
    second = WorkerBridge(home=home, sandbox=FakeSandbox())
    retried = second.retry_task(made.task_id)
    assert retried.profile == {"type": "chore", "filled": ["limits.timeout_seconds"]}
    doc = stored(second, retried.task_id)
    assert doc["priority"] == 70 and doc["limits"]["timeout_seconds"] == 120
    second.close()


# -- the CLI -------------------------------------------------------------------------------------


def test_the_cli_s_type_fills_only_what_neither_flags_nor_the_spec_file_set(cli, workdir, repo):
    path = write_spec(workdir / "spec.json", bare_spec(repo, limits={"timeout_seconds": 300}))
    res = cli("tasks", "create", "--spec", str(path), "--type", "hotfix", "--priority", "40")
    assert res.code == 0, res.stderr
    task_id = res.stdout.strip()
    shown = cli("tasks", "show", task_id, "--json").json()
    assert shown["profile"] == {"type": "hotfix", "filled": ["metadata.auto_repair"]}
    text = cli("tasks", "show", task_id)
    assert "type: hotfix   its profile filled: metadata.auto_repair" in text.stdout
    bridge = WorkerBridge(home=workdir / "home", sandbox=FakeSandbox())
    doc = stored(bridge, task_id)
    assert (doc["priority"], doc["limits"]["timeout_seconds"]) == (40, 300)
    bridge.close()


def test_the_cli_refuses_an_unknown_type_in_one_line_and_takes_one_config_adds(
    cli, home, workdir, repo
):
    flags = ["--repo", str(repo), "--objective", "x", "--worker", "mock"]
    bad = cli("tasks", "create", *flags, "--type", "epic")
    assert bad.code == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "known types: chore, feature, hotfix" in bad.stderr
    (home / "config.yaml").write_text("profiles:\n  epic: {priority: 5}\n")
    good = cli("tasks", "create", *flags, "--type", "epic", "--json")
    assert good.code == 0, good.stderr
    assert good.json()["profile"] == {"type": "epic", "filled": ["priority"]}
    spec_typed = create_spec(cli, workdir, bare_spec(repo, metadata={"type": "nope"}))
    assert spec_typed.code == 2 and "'nope'" in spec_typed.stderr
    assert json.loads(cli("tasks", "list", "--json").stdout)["tasks"][0]["profile"]["type"] == (
        "epic"
    )
