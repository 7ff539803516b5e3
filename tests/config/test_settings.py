"""One config loader: defaults, config.yaml, then env; unknown keys are errors naming the key."""

from __future__ import annotations

import pytest

from bridge.config.settings import load_config
from bridge.errors import ConfigError


def test_defaults_are_documented_values(home):
    config = load_config(env={"WORKER_BRIDGE_HOME": str(home)})
    assert config.max_concurrency == 4
    assert config.repo_concurrency == 3
    assert config.store_path == home / "bridge.db"
    assert config.limits.timeout_seconds == 1800
    assert config.sandbox_uid == 10001


def test_the_http_listener_bounds_have_defaults_and_come_from_yaml_or_env(home):
    config = load_config(env={"WORKER_BRIDGE_HOME": str(home)})
    assert (config.http.head_timeout_s, config.http.body_timeout_s) == (10, 30)
    assert (config.http.max_connections, config.http.max_connections_per_client) == (256, 32)
    assert (config.http.max_sessions, config.http.session_idle_timeout_s) == (256, 1800)
    (home / "config.yaml").write_text("http:\n  max_sessions: 9\n  head_timeout_s: 2.5\n")
    env = {"WORKER_BRIDGE_HOME": str(home), "WORKER_BRIDGE_HTTP__MAX_SESSIONS": "3"}
    config = load_config(env=env)
    assert (config.http.max_sessions, config.http.head_timeout_s) == (3, 2.5)
    with pytest.raises(ConfigError, match="WORKER_BRIDGE_HTTP__MAX_CONNECTIONS"):
        load_config(env={**env, "WORKER_BRIDGE_HTTP__MAX_CONNECTIONS": "0"})
    (home / "config.yaml").write_text("http:\n  header_timeout_s: 2\n")
    with pytest.raises(ConfigError, match="http.header_timeout_s"):
        load_config(env={"WORKER_BRIDGE_HOME": str(home)})


def test_env_wins_over_config_yaml(home):
    (home / "config.yaml").write_text("max_concurrency: 7\nrepo_concurrency: 5\n")
    env = {"WORKER_BRIDGE_HOME": str(home), "WORKER_BRIDGE_MAX_CONCURRENCY": "2"}
    config = load_config(env=env)
    assert config.max_concurrency == 2
    assert config.repo_concurrency == 5


def test_store_path_can_be_overridden(home, workdir):
    env = {"WORKER_BRIDGE_HOME": str(home), "WORKER_BRIDGE_STORE": str(workdir / "x.db")}
    assert load_config(env=env).store_path == workdir / "x.db"


def test_an_unknown_key_in_config_yaml_is_an_error_naming_it(home):
    (home / "config.yaml").write_text("max_concurency: 3\n")
    with pytest.raises(ConfigError, match="max_concurency"):
        load_config(env={"WORKER_BRIDGE_HOME": str(home)})


def test_an_unknown_nested_key_is_named_with_its_path(home):
    (home / "config.yaml").write_text("limits:\n  memry_mb: 3\n")
    with pytest.raises(ConfigError, match="limits.memry_mb"):
        load_config(env={"WORKER_BRIDGE_HOME": str(home)})


def test_a_bad_value_from_the_environment_is_an_error_naming_the_key(home):
    env = {"WORKER_BRIDGE_HOME": str(home), "WORKER_BRIDGE_REPO_CONCURRENCY": "many"}
    with pytest.raises(ConfigError, match="WORKER_BRIDGE_REPO_CONCURRENCY"):
        load_config(env=env)


def test_invalid_yaml_is_a_clear_error(home):
    (home / "config.yaml").write_text("a: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(env={"WORKER_BRIDGE_HOME": str(home)})


def test_the_effective_config_is_recorded_with_each_task(bridge, repo):
    (bridge.config.home / "config.yaml").write_text("auto_repair: 0\n")
    task = bridge.create_task(
        {
            "objective": "x",
            "worker": "mock",
            "workspace": {"repository": str(repo)},
            "limits": {"timeout_seconds": 42},
        }
    )
    stored = bridge.store.load_task(task.task_id)
    assert stored.limits.timeout_seconds == 42
    assert stored.config.max_concurrency == 4


def test_an_unknown_worker_bridge_variable_is_an_error_naming_it_like_an_unknown_key(tmp_path):
    from bridge.config.settings import OTHER_VARIABLES

    env = {"WORKER_BRIDGE_HOME": str(tmp_path), "WORKER_BRIDGE_MAX_CONCURENCY": "2"}
    with pytest.raises(ConfigError) as refused:
        load_config(env=env)
    message = refused.value.message
    assert "WORKER_BRIDGE_MAX_CONCURENCY" in message and "WORKER_BRIDGE_MAX_CONCURRENCY" in message
    # Keys (nested ones too), and the variables that are not keys, pass.
    fine = {
        "WORKER_BRIDGE_HOME": str(tmp_path),
        "WORKER_BRIDGE_MAX_CONCURRENCY": "2",
        "WORKER_BRIDGE_LIMITS__TIMEOUT_SECONDS": "60",
        **{f"WORKER_BRIDGE_{name}": "x" for name in OTHER_VARIABLES},
    }
    config = load_config(env=fine)
    assert config.max_concurrency == 2 and config.limits.timeout_seconds == 60
    with pytest.raises(ConfigError, match="LIMITS__TIMEOUT_SECONDZ|timeout_secondz"):
        load_config(env={**fine, "WORKER_BRIDGE_LIMITS__TIMEOUT_SECONDZ": "1"})


YAML_FILES = [
    "",
    "max_concurrency: 7\nlimits:\n  memory_mb: 512\ngateway:\n  max_connections: 9\n"
    "repositories: [/srv/a, /srv/b]\nworkers:\n  mine: {command: [my-agent, '{prompt}']}\n",
]
PLAIN_ENVS = [
    {},
    {"WORKER_BRIDGE_MAX_CONCURRENCY": "2", "WORKER_BRIDGE_STORE": "/tmp/x.db"},
    {"WORKER_BRIDGE_ALLOW_MOCK_ROUTES": "true", "WORKER_BRIDGE_RUNTIME": "", "OTHER": "1"},
    {"worker_bridge_disk_reserve_gb": "1.5", "WORKER_BRIDGE_EXTRA_CA_FILE": "/etc/ca.pem"},
    {"WORKER_BRIDGE_TEST_BASE_IMAGE": "base:1", "WORKER_BRIDGE_MCP_TOKEN": "t" * 20},
]


@pytest.mark.parametrize("text", YAML_FILES)
@pytest.mark.parametrize("variables", PLAIN_ENVS)
def test_plain_variables_load_as_pydantic_settings_loads_them(home, text, variables):
    from bridge.config.settings import _load_by_settings, _plain_variables

    (home / "config.yaml").write_text(text)
    env = {"WORKER_BRIDGE_HOME": str(home), **variables}
    assert _plain_variables(env) is not None  # the path that does not import pydantic-settings
    overrides = {"limits": {"cpus": 2.0}, "repo_concurrency": 1}
    expected = _load_by_settings(env, home / "config.yaml", {**overrides, "home": home})
    assert load_config(env=env, **overrides) == expected
    assert expected.limits.cpus == 2.0 and expected.repo_concurrency == 1
    if text:  # the file's nested keys are kept beside the override's, as pydantic-settings does
        assert expected.limits.memory_mb == 512 and expected.gateway.max_connections == 9


@pytest.mark.parametrize(
    "name, value, key, expected",
    [
        ("WORKER_BRIDGE_GATEWAY__MAX_CONNECTIONS", "3", "gateway", {"max_connections": 3}),
        ("WORKER_BRIDGE_REPOSITORIES", '["/srv/c"]', "repositories", ["/srv/c"]),
        ("WORKER_BRIDGE_LIMITS", '{"pids": 64}', "limits", {"pids": 64}),
    ],
)
def test_nested_or_structured_variables_go_through_pydantic_settings(
    home, name, value, key, expected
):
    from bridge.config.settings import _plain_variables

    env = {"WORKER_BRIDGE_HOME": str(home), name: value}
    assert _plain_variables(env) is None
    got = load_config(env=env).model_dump(mode="json")[key]
    if isinstance(expected, dict):
        got = {k: got[k] for k in expected}
    assert got == expected


def test_every_variable_ci_and_the_makefile_export_is_one_the_bridge_accepts(tmp_path):
    # .ci/run exports them for the whole run, and the bridge refuses a WORKER_BRIDGE_* name it
    # does not know: one missing from the list stops CI at its first worker-bridge command.
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    exported = {
        name
        for path in (root / ".ci" / "run", root / "Makefile")
        for name in re.findall(r"export (WORKER_BRIDGE_\w+)", path.read_text())
    }
    assert "WORKER_BRIDGE_REQUIRE_DOCKER" in exported, "the pattern finds them"
    load_config(env={"WORKER_BRIDGE_HOME": str(tmp_path), **dict.fromkeys(exported, "1")})
