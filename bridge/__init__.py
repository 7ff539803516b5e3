"""worker-bridge: delegate coding tasks to CLI agents in disposable containers, verified on
the host. The library facade is `WorkerBridge`; errors derive from `BridgeError`.

`WorkerBridge` and `TaskResult` load on first use: every `bridge.*` import (the CLI's
`--help`, a detached runner, the trash remover) starts here, and the facade pulls in pydantic
and the whole pipeline, which most of those never need."""

from __future__ import annotations

from bridge.errors import (
    BridgeError,
    ConfigError,
    EngineUnavailable,
    ImageMissing,
    InvalidSpec,
    TaskNotFound,
    UnknownWorker,
)
from bridge.version import __version__

# Not `typing.TYPE_CHECKING`: `typing` (with `re`) is a third of the console script's imports,
# which start here too (bridge/warm/client.py). Type checkers read the name as theirs.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from bridge.records import TaskResult
    from bridge.service import WorkerBridge

__all__ = [
    "BridgeError",
    "ConfigError",
    "EngineUnavailable",
    "ImageMissing",
    "InvalidSpec",
    "TaskNotFound",
    "TaskResult",
    "UnknownWorker",
    "WorkerBridge",
    "__version__",
]


def __getattr__(name: str) -> object:
    if name == "WorkerBridge":
        from bridge.service import WorkerBridge

        return WorkerBridge
    if name == "TaskResult":
        from bridge.records import TaskResult

        return TaskResult
    raise AttributeError(f"module 'bridge' has no attribute {name!r}")
