"""worker-bridge: delegate coding tasks to CLI agents in disposable containers, verified on
the host. The library facade is `WorkerBridge`; errors derive from `BridgeError`."""

from bridge.errors import (
    BridgeError,
    ConfigError,
    EngineUnavailable,
    ImageMissing,
    InvalidSpec,
    TaskNotFound,
    UnknownWorker,
)
from bridge.records import TaskResult
from bridge.service import WorkerBridge
from bridge.version import __version__

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
