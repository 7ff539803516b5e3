"""worker-bridge: delegate coding tasks to CLI agents in disposable containers, verified on
the host. The library facade is `WorkerBridge`; errors derive from `BridgeError`."""

__version__ = "0.1.0"

from bridge.errors import (  # noqa: E402
    BridgeError,
    ConfigError,
    EngineUnavailable,
    ImageMissing,
    InvalidSpec,
    TaskNotFound,
    UnknownWorker,
)
from bridge.service import WorkerBridge  # noqa: E402

__all__ = [
    "BridgeError",
    "ConfigError",
    "EngineUnavailable",
    "ImageMissing",
    "InvalidSpec",
    "TaskNotFound",
    "UnknownWorker",
    "WorkerBridge",
    "__version__",
]
