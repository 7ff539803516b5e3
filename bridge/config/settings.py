"""One configuration loader for every entry point: defaults, then `$WORKER_BRIDGE_HOME/config.yaml`,
then `WORKER_BRIDGE_*` environment variables (env wins), then a library caller's overrides.

`Config` is plain data: it is recorded with every task, and a task's runner (in this process or a
detached one) runs with the configuration recorded for it, not with its own environment.
Loading is pydantic-settings' job: every key can come from the environment as
`WORKER_BRIDGE_<KEY>` (nested keys as `WORKER_BRIDGE_<KEY>__<SUBKEY>`, mappings and lists as JSON).
When no variable sets a nested or structured key, there is nothing for its environment parsing
to do (a plain key's value is the string itself), and the sources are merged here, the same way,
without importing it: pydantic-settings (and the asyncio it loads) is a quarter of a CLI
command's start-up otherwise (tests/config/test_settings.py checks both ways give the same config).
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Mapping
from contextvars import ContextVar
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bridge.config.names import ENV_PREFIX, OTHER_VARIABLES, default_home, variables
from bridge.config.sections import (
    CircuitConfig,
    ClusterConfig,
    GatewayConfig,
    HttpConfig,
    JobsConfig,
    LimitDefaults,
    LinkedWorker,
    PoolConfig,
    RouteConfig,
    TaskProfile,
    WorkerSettings,
)
from bridge.errors import ConfigError
from bridge.models import Environment, JsonObject, describe_validation_error
from bridge.version import __version__

__all__ = [
    "CircuitConfig",
    "PoolConfig",
    "Config",
    "GatewayConfig",
    "HttpConfig",
    "JobsConfig",
    "LimitDefaults",
    "LinkedWorker",
    "RouteConfig",
    "TaskProfile",
    "WorkerSettings",
    "load_config",
]


class Config(BaseModel):
    """The effective configuration. Every key has a default; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    home: Path = Field(description="State root: store, worktrees, artifacts.")
    store: Path | None = Field(None, description="SQLite path; default <home>/bridge.db.")
    max_concurrency: int = Field(4, ge=1, description="Task containers at once on this host.")
    repo_concurrency: int = Field(3, ge=1, description="Task containers at once per repository.")
    image_tag: str = Field(__version__, description="Tag of the worker-bridge images.")
    base_image: str = Field(
        "debian:bookworm-slim", description="BASE_IMAGE build argument for images build."
    )
    verify_image: str | None = Field(
        None, description="Verification image; default worker-bridge/verify:<image_tag>."
    )
    runtime: str | None = Field(None, description="Container runtime, e.g. 'runsc' (gVisor).")
    sandbox_uid: int = Field(10001, ge=1, description="Sandbox uid when the bridge runs as root.")
    extra_ca_file: Path | None = Field(
        None, description="PEM bundle added to image builds and mounted into containers."
    )
    limits: LimitDefaults = Field(default_factory=LimitDefaults)
    worker_concurrency: dict[str, int] = Field(
        default_factory=dict, description="Task containers at once per worker (name -> limit)."
    )
    disk_reserve_gb: float | None = Field(
        None, ge=0, description="Free disk to keep; default max(10 GiB, 5% of the disk)."
    )
    allocation_timeout_s: int = Field(300, ge=1, description="Deadline for creating a worktree.")
    layered_checkouts: bool = Field(
        True,
        description="A task's worktree and verification checkouts as overlay mounts over one "
        "read-only checkout per base commit, where the host can mount them (the bridge runs as "
        "root); otherwise, and when false, full checkouts.",
    )
    auto_repair: int = Field(1, ge=0, description="Repair turns after failed verification.")
    retention_days: int = Field(14, ge=0, description="Days artifacts of finished tasks are kept.")
    output_tail_chars: int = Field(4000, ge=100, description="Bound on stored output tails.")
    max_progress_events: int = Field(2000, ge=10, description="worker.progress events per task.")
    repositories: list[Path] = Field(
        default_factory=list,
        description="Folders tasks may work in (each repository must be inside one); empty: "
        "any repository this user can read. Set it for a shared service (MCP over HTTP).",
    )
    allow_mock_routes: bool = Field(
        False,
        description="Let the mock worker's metadata.mock.routes ask for gateway model routes "
        "(tests and demos): such a task's script then reaches a route with the host's key, so "
        "it is off unless the owner turns it on.",
    )
    allowed_images: list[str] = Field(
        default_factory=list,
        description="Images a task's spec may name (environment.image, verification.image, a "
        "devcontainer.json's image), as glob patterns such as 'my-org/*'; besides these, only "
        "this state root's own (worker-bridge/*:<image_tag> and its project environments).",
    )
    workers: dict[str, LinkedWorker] = Field(default_factory=dict, description="Linked workers.")
    worker_settings: dict[str, WorkerSettings] = Field(
        default_factory=dict, description="Route and model of the built-in workers, by name."
    )
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    environments: dict[str, Environment] = Field(
        default_factory=dict,
        description="A default `environment` per repository (absolute path -> the spec's "
        "`environment` document), used when a task's spec names none.",
    )
    setup_timeout_s: int = Field(
        1800, ge=1, description="Deadline of an environment's setup (all its commands)."
    )
    jobs: JobsConfig = Field(
        default_factory=JobsConfig, description="Bounds of jobs (candidates, rounds, quoting)."
    )
    http: HttpConfig = Field(
        default_factory=HttpConfig,
        description="Bounds of the MCP server's HTTP listener (deadlines, connection and "
        "session caps).",
    )
    circuit: CircuitConfig = Field(
        default_factory=CircuitConfig,
        description="The circuit breaker per worker: failures that open it, their window, and "
        "the cool-down before one task is tried again.",
    )
    cluster: ClusterConfig = Field(
        default_factory=ClusterConfig,
        description="Worker turns on the nodes of a Ray cluster (docs/cluster.md).",
    )
    pool: PoolConfig = Field(
        default_factory=PoolConfig,
        description="Started containers kept ready for the next tasks (size 0: none).",
    )
    profiles: dict[str, TaskProfile] = Field(
        default_factory=dict,
        description="Task types (`metadata.type`, `--type`) added to the built-in ones "
        "(chore, feature, hotfix, refactor), or fields of a built-in one overridden: what each "
        "fills in when the caller left it unset (bridge/config/profiles.py).",
    )

    @field_validator("profiles")
    @classmethod
    def _profile_names(cls, value: dict[str, TaskProfile]) -> dict[str, TaskProfile]:
        import re

        for name in value:
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name):
                raise ValueError(
                    f"task type '{name}' must be a lower-case word (letters, digits, - and _)"
                )
        return value

    @property
    def store_path(self) -> Path:
        return self.store or self.home / "bridge.db"

    @property
    def verify_image_ref(self) -> str:
        return self.verify_image or f"worker-bridge/verify:{self.image_tag}"

    def image_for(self, name: str) -> str:
        return f"worker-bridge/{name}:{self.image_tag}"

    @property
    def config_file(self) -> Path:
        return self.home / "config.yaml"

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Config:
        """The configuration recorded with a task (keys an older version wrote and this one no
        longer knows are left out, rather than failing an old task)."""
        return cls.model_validate({k: v for k, v in data.items() if k in cls.model_fields})


# The environment and config file of the load in progress (settings sources are built by
# pydantic-settings from the class, so they read the call's inputs from here).
_LOADING: ContextVar[tuple[Mapping[str, str], Path]] = ContextVar("_LOADING")


@cache
def _settings_class() -> type[Config]:
    """Config as pydantic-settings' BaseSettings, with our sources: built on first use."""
    from pydantic_settings import (
        BaseSettings,
        EnvSettingsSource,
        PydanticBaseSettingsSource,
        SettingsConfigDict,
        YamlConfigSettingsSource,
    )

    class _EnvSource(EnvSettingsSource):
        """WORKER_BRIDGE_* variables from the mapping given to `load_config` (os.environ by
        default)."""

        def _load_env_vars(self) -> Mapping[str, str | None]:
            env, _ = _LOADING.get()
            return {key.lower(): value for key, value in env.items() if value != ""}

    class _Settings(BaseSettings, Config):
        model_config = SettingsConfigDict(
            env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", case_sensitive=False
        )

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            _, path = _LOADING.get()
            sources: list[PydanticBaseSettingsSource] = [init_settings, _EnvSource(settings_cls)]
            if path.exists():
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
            return tuple(sources)

    return _Settings


def load_config(env: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Build the effective config. ``overrides`` (used by the library) win over everything."""
    env = dict(os.environ if env is None else env)
    home = Path(overrides.pop("home", None) or default_home(env)).expanduser().absolute()
    path = home / "config.yaml"
    _check_variables(env)
    from_file = _read_yaml(path)
    plain = _plain_variables(env)
    try:
        if plain is None:
            return _load_by_settings(env, path, {**overrides, "home": home})
        # the three sources merged as pydantic-settings merges them
        return Config.model_validate(_deep_update(from_file, plain, {**overrides, "home": home}))
    except ValidationError as exc:
        raise _config_error(exc, env, path, overrides) from exc


def _load_by_settings(env: Mapping[str, str], path: Path, init: JsonObject) -> Config:
    """The config through pydantic-settings' sources: ``init``, then ``env``, then ``path``."""
    token = _LOADING.set((env, path))
    try:
        loaded = _settings_class()(**init)
    finally:
        _LOADING.reset(token)
    return Config.model_validate(loaded.model_dump())


def _plain_variables(env: Mapping[str, str]) -> dict[str, str] | None:
    """The keys WORKER_BRIDGE_* variables set, when each sets a plain top-level key (a string,
    number, flag or path: pydantic-settings hands such a value over as the string it is), else
    None: a nested (`KEY__SUB`) or structured key (JSON) is left to pydantic-settings."""
    found: dict[str, str] = {}
    for name, value in env.items():
        if not name.upper().startswith(ENV_PREFIX) or value == "":
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key.upper() in OTHER_VARIABLES and key not in Config.model_fields:
            continue
        if key not in _PLAIN_KEYS:
            return None
        found[key] = value
    return found


def _is_plain(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return all(_is_plain(arg) for arg in typing.get_args(annotation))
    return annotation in (str, int, float, bool, Path, type(None))


_PLAIN_KEYS = frozenset(k for k, f in Config.model_fields.items() if _is_plain(f.annotation))


def _deep_update(base: JsonObject, *updates: Mapping[str, Any]) -> JsonObject:
    """pydantic-settings' merge of its sources: later ones win, mappings merged key by key."""
    merged = dict(base)
    for update in updates:
        for key, value in update.items():
            if isinstance(merged.get(key), dict) and isinstance(value, dict):
                merged[key] = _deep_update(merged[key], value)
            else:
                merged[key] = value
    return merged


def _check_variables(env: Mapping[str, str]) -> None:
    """ConfigError naming a WORKER_BRIDGE_* variable that is neither a key (nested keys as
    KEY__SUBKEY, which the key's own model checks) nor one of OTHER_VARIABLES."""
    for name, key in variables(env, Config.model_fields):
        if key is not None:
            continue
        import difflib

        known = [f"{ENV_PREFIX}{k.upper()}" for k in Config.model_fields] + [
            f"{ENV_PREFIX}{k}" for k in OTHER_VARIABLES
        ]
        close = difflib.get_close_matches(name.upper(), known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"Unknown environment variable {name}{hint}; unset it or fix its name (every "
            "configuration key can be set as WORKER_BRIDGE_<KEY>)."
        )


def _read_yaml(path: Path) -> JsonObject:
    """The config file's mapping ({} when there is none); one that is not a YAML mapping is
    named as such, before pydantic sees it."""
    if not path.exists():
        return {}
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML ({exc.__class__.__name__}); fix it.") from exc
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values.")
    return loaded or {}


def _config_error(
    exc: ValidationError, env: Mapping[str, str], path: Path, overrides: Mapping[str, object]
) -> ConfigError:
    """One sentence naming the environment variable or the config file's key that is wrong."""
    first = exc.errors()[0]
    key = str(first["loc"][0]) if first["loc"] else ""
    if key and key not in overrides:
        names = [f"{ENV_PREFIX}{key.upper()}"]
        if len(first["loc"]) > 1:
            nested = "__".join(str(part).upper() for part in first["loc"])
            names.insert(0, f"{ENV_PREFIX}{nested}")
        for name in names:
            if env.get(name):
                msg = first["msg"].removeprefix("Value error, ")
                return ConfigError(f"Invalid value {env[name]!r} for {name}: {msg}.")
    return ConfigError(describe_validation_error(exc, f"configuration ({path})"))


def save_linked_worker(config: Config, name: str, worker: LinkedWorker) -> None:
    """Record a linked worker in config.yaml, keeping the file's other keys."""
    import yaml

    path = config.config_file
    data: JsonObject = {}
    if path.exists():
        data = yaml.safe_load(path.read_text()) or {}
    data.setdefault("workers", {})[name] = worker.model_dump(exclude_none=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=True))
