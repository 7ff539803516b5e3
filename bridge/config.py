"""One configuration loader for every entry point: defaults, then `$WORKER_BRIDGE_HOME/config.yaml`,
then `WORKER_BRIDGE_*` environment variables (env wins), then a library caller's overrides.

`Config` is plain data: it is recorded with every task, and a task's runner (in this process or a
detached one) runs with the configuration recorded for it, not with its own environment.
Loading is pydantic-settings' job: every key can come from the environment as
`WORKER_BRIDGE_<KEY>` (nested keys as `WORKER_BRIDGE_<KEY>__<SUBKEY>`, mappings and lists as JSON).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from bridge.config_sections import GatewayConfig, HttpConfig, JobsConfig, RouteConfig
from bridge.errors import ConfigError
from bridge.models import Environment, describe_validation_error
from bridge.version import __version__

ENV_PREFIX = "WORKER_BRIDGE_"
# WORKER_BRIDGE_* variables that are not configuration keys; any other that names no key is an
# error naming it, as an unknown key in config.yaml is (a misspelt limit must not pass silently).
OTHER_VARIABLES = {
    "MCP_TOKEN": "the MCP HTTP server's bearer token",
    "MCP_TOKEN_FILE": "a file holding that token",
    "IN_CONTAINER": "set in the bridge's own image: the same-path check is on",
    "REPOS": "the repositories folder of the compose deployment",
    "IMAGES_DIR": "image contexts to build instead of the package's own",
    "SMOKE_KEY": "the throwaway key of `images build --smoke`",
    # compose/compose.yaml's own settings, read by docker-compose from the same shell
    "VERSION": "compose: the bridge image's tag",
    "BIND": "compose: the address the port is published on",
    "PORT": "compose: the published port",
    "TOKEN_FILE": "compose: the token file given to the container as a secret",
    "SOURCE": "the bridge image's source label (a build argument)",
    # the test suite's and CI's
    "REQUIRE_DOCKER": "tests: fail rather than skip without an engine",
    "REQUIRE_INTEROP": "tests: fail rather than skip without the TypeScript client",
    "REQUIRE_RUNSC": "tests: fail rather than skip without gVisor",
    "REQUIRE_BROWSER": "tests: fail rather than skip without chromium and Playwright",
    "TEST_ARTIFACTS": "tests: where the browser tests' screenshots go",
    "UPDATE_DOCS": "tests: also copy the README's screenshot into docs/",
    "TEST_BASE_IMAGE": "tests and bench: the local base image",
    "MCP_COMMAND": "the interop test's server command",
    "INTEROP_REPO": "the interop test's repository",
}


__all__ = [
    "Config",
    "GatewayConfig",
    "HttpConfig",
    "JobsConfig",
    "LimitDefaults",
    "LinkedWorker",
    "RouteConfig",
    "WorkerSettings",
    "load_config",
]


class LimitDefaults(BaseModel):
    """Limits applied when a task's spec leaves them out."""

    model_config = ConfigDict(extra="forbid")
    timeout_seconds: int = Field(1800, ge=1, description="Deadline for the whole task.")
    memory_mb: int = Field(2048, ge=16, description="Memory limit of each task container.")
    cpus: float = Field(1.0, gt=0, description="CPU quota of each task container.")
    pids: int = Field(512, ge=16, description="Process limit of each task container.")
    disk_mb: int = Field(
        8192,
        ge=1,
        description="Disk the worktree and verification checkout may use, enforced "
        "while containers run (error kind `disk`).",
    )
    file_mb: int = Field(
        100,
        ge=1,
        description="Largest file a change may hold (`disk`, before anything is "
        "written into the repository's object store).",
    )
    change_mb: int = Field(
        1024, ge=1, description="Largest whole change, all its files together (`disk`)."
    )
    files: int = Field(
        500_000, ge=100, description="Files (and links) a worktree may hold when collected."
    )
    log_mb: int = Field(16, ge=1, description="What the engine keeps of one container's output.")
    line_kb: int = Field(64, ge=1, description="Longest output line read; the rest is cut.")
    secrets: int = Field(
        1000, ge=10, description="Secret values learned from output and remembered per task."
    )


class LinkedWorker(BaseModel):
    """A command-line agent registered with `worker-bridge workers link`."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(min_length=1, description="argv; '{prompt}' is replaced.")
    image: str | None = Field(None, description="Image to run it in; default the base image.")
    routes: list[str] = Field(default_factory=list, description="Gateway model routes it uses.")


class WorkerSettings(BaseModel):
    """Settings of a built-in worker (codex, claude-code, opencode, zcode-glm)."""

    model_config = ConfigDict(extra="forbid")
    route: str | None = Field(
        None, description="Gateway model route it uses; default the worker's own (see workers.md)."
    )
    model: str | None = Field(None, description="Model the CLI asks for; default the CLI's own.")


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


class _EnvSource(EnvSettingsSource):
    """WORKER_BRIDGE_* variables from the mapping given to `load_config` (os.environ by default)."""

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


def default_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = env.get(f"{ENV_PREFIX}HOME")
    return Path(raw).expanduser().absolute() if raw else Path.home() / ".worker-bridge"


def load_config(env: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Build the effective config. ``overrides`` (used by the library) win over everything."""
    env = dict(os.environ if env is None else env)
    home = Path(overrides.pop("home", None) or default_home(env)).expanduser().absolute()
    path = home / "config.yaml"
    _check_variables(env)
    _check_yaml(path)
    token = _LOADING.set((env, path))
    try:
        loaded = _Settings(**overrides, home=home)
    except ValidationError as exc:
        raise _config_error(exc, env, path, overrides) from exc
    finally:
        _LOADING.reset(token)
    return Config.model_validate(loaded.model_dump())


def _check_variables(env: Mapping[str, str]) -> None:
    """ConfigError naming a WORKER_BRIDGE_* variable that is neither a key (nested keys as
    KEY__SUBKEY, which the key's own model checks) nor one of OTHER_VARIABLES."""
    import difflib

    keys = set(Config.model_fields)
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :]
        if rest.split("__", 1)[0].lower() in keys or rest.upper() in OTHER_VARIABLES:
            continue
        known = [f"{ENV_PREFIX}{k.upper()}" for k in keys] + [
            f"{ENV_PREFIX}{k}" for k in OTHER_VARIABLES
        ]
        close = difflib.get_close_matches(name.upper(), known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"Unknown environment variable {name}{hint}; unset it or fix its name (every "
            "configuration key can be set as WORKER_BRIDGE_<KEY>)."
        )


def _check_yaml(path: Path) -> None:
    """A config file that is not a YAML mapping is named as such, before pydantic sees it."""
    if not path.exists():
        return
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML ({exc.__class__.__name__}); fix it.") from exc
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values.")


def _config_error(
    exc: ValidationError, env: Mapping[str, str], path: Path, overrides: dict[str, Any]
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
    data: dict[str, Any] = {}
    if path.exists():
        data = yaml.safe_load(path.read_text()) or {}
    data.setdefault("workers", {})[name] = worker.model_dump(exclude_none=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=True))
