"""One configuration loader for every entry point: defaults, then `$WORKER_BRIDGE_HOME/config.yaml`,
then `WORKER_BRIDGE_*` environment variables (env wins). The effective config is stored per task.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bridge import __version__
from bridge.errors import ConfigError
from bridge.models import describe_validation_error


class LimitDefaults(BaseModel):
    """Limits applied when a task's spec leaves them out."""

    model_config = ConfigDict(extra="forbid")
    timeout_seconds: int = Field(1800, ge=1, description="Deadline for the whole task.")
    memory_mb: int = Field(2048, ge=16, description="Memory limit of each task container.")
    cpus: float = Field(1.0, gt=0, description="CPU quota of each task container.")
    pids: int = Field(512, ge=16, description="Process limit of each task container.")


class LinkedWorker(BaseModel):
    """A command-line agent registered with `worker-bridge workers link`."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(min_length=1, description="argv; '{prompt}' is replaced.")
    image: str | None = Field(None, description="Image to run it in; default the base image.")


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
    workers: dict[str, LinkedWorker] = Field(default_factory=dict, description="Linked workers.")

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


# Scalar keys that may come from the environment as WORKER_BRIDGE_<KEY>.
_ENV_KEYS = (
    "store",
    "max_concurrency",
    "repo_concurrency",
    "image_tag",
    "base_image",
    "verify_image",
    "runtime",
    "sandbox_uid",
    "extra_ca_file",
    "auto_repair",
    "retention_days",
    "disk_reserve_gb",
    "allocation_timeout_s",
)


def default_home(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = env.get("WORKER_BRIDGE_HOME")
    return Path(raw).expanduser().absolute() if raw else Path.home() / ".worker-bridge"


def load_config(env: dict[str, str] | None = None, **overrides: Any) -> Config:
    """Build the effective config. ``overrides`` (used by the library) win over everything."""
    env = dict(os.environ if env is None else env)
    home = Path(overrides.pop("home", None) or default_home(env)).expanduser().absolute()
    data: dict[str, Any] = {}
    path = home / "config.yaml"
    if path.exists():
        import yaml  # only when there is a config file to read

        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"{path} is not valid YAML ({exc.__class__.__name__}); fix it."
            ) from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping of keys to values.")
        data.update(loaded)
    from_env = set()
    for key in _ENV_KEYS:
        value = env.get(f"WORKER_BRIDGE_{key.upper()}")
        if value not in (None, ""):
            data[key] = value
            from_env.add(key)
    data.update(overrides)
    data["home"] = home
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else ""
        if key in from_env and key not in overrides:
            name = f"WORKER_BRIDGE_{key.upper()}"
            msg = first["msg"].removeprefix("Value error, ")
            raise ConfigError(f"Invalid value {env[name]!r} for {name}: {msg}.") from exc
        raise ConfigError(describe_validation_error(exc, f"configuration ({path})")) from exc


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
