"""The exception tree of worker-bridge.

Expected outcomes (a worker exiting non-zero, a failed check, a refused accept) are *results*,
not exceptions. Exceptions are for bad input and for the unexpected::

    BridgeError                      (RuntimeError)  root; .message is one actionable sentence
    ├── InvalidSpec                  (ValueError)    the spec or an argument is wrong   -> exit 2
    │   ├── UnknownWorker
    │   └── InvalidRepository
    ├── ConfigError                  (ValueError)    config.yaml / env is wrong         -> exit 2
    ├── TaskNotFound                 (LookupError)   no task with that id               -> exit 2
    ├── JobNotFound                  (LookupError)   no job with that id                -> exit 2
    ├── InvalidTransition                            a status change the table forbids
    ├── TaskStateError                               the task is not in a state that allows it
    ├── DiskFull                     (OSError)       free disk below the reserve, or a limit
    ├── CircuitOpen                                  the worker's circuit breaker refuses -> exit 1
    ├── EngineUnavailable            (ConnectionError) the Docker engine cannot be reached -> exit 1
    ├── ImageMissing                 (LookupError)   an image a task needs is not built  -> exit 1
    ├── GitError                                     a git command failed unexpectedly
    ├── StoreUnavailable             (OSError)       the store cannot be opened or written -> exit 1
    ├── RecordUnreadable                             a stored row this version cannot read -> exit 1
    ├── EnvironmentFailed                            the project's environment could not be made
    └── SandboxError                                 the engine refused or failed a container op
        └── ImageMismatch            (ValueError)    a node's image is not the control host's

Third-party errors (docker-py, sqlite, subprocess) are translated at the edge that calls them,
with ``raise ... from exc``.
"""

from __future__ import annotations


class BridgeError(RuntimeError):
    """Root of every error worker-bridge raises on purpose."""

    exit_code = 1
    kind = "internal"

    def __init__(self, message: str, *, kind: str | None = None, **fields: object) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        if kind is not None:
            self.kind = kind  # the task error kind this maps to, when not the class default

    def __str__(self) -> str:
        return self.message


class InvalidSpec(BridgeError, ValueError):
    exit_code = 2
    kind = "invalid_spec"


class UnknownWorker(InvalidSpec):
    pass


class InvalidRepository(InvalidSpec):
    pass


class ConfigError(BridgeError, ValueError):
    exit_code = 2
    kind = "invalid_spec"


class TaskNotFound(BridgeError, LookupError):
    exit_code = 2

    @classmethod
    def of(cls, task_id: str) -> TaskNotFound:
        """The one answer for an unknown task id, and for a task outside `repositories`: the
        two are never told apart."""
        return cls(f"No task '{task_id}' in this store; `worker-bridge tasks list` shows the ids.")


class JobNotFound(BridgeError, LookupError):
    exit_code = 2

    @classmethod
    def of(cls, job_id: str) -> JobNotFound:
        """The one answer for an unknown job id, and for a job outside `repositories`."""
        return cls(f"No job '{job_id}' in this store; `worker-bridge jobs list` shows the ids.")


class InvalidTransition(BridgeError):
    pass


class TaskStateError(BridgeError):
    """The call does not fit the task's status (start a running task, follow up a queued one)."""

    kind = "invalid_spec"


class CircuitOpen(BridgeError):
    """A new task for a worker whose circuit breaker is open (or half-open with its one task
    already let through): the message names the worker, its recent failures and when it is
    tried again (bridge/workers/circuit.py)."""

    def __init__(self, message: str, *, worker: str) -> None:
        super().__init__(message, worker=worker)
        self.worker = worker


class DiskFull(BridgeError, OSError):
    kind = "disk"


class EngineUnavailable(BridgeError, ConnectionError):
    kind = "sandbox"


class ImageMissing(BridgeError, LookupError):
    kind = "sandbox"


class GitError(BridgeError):
    def __init__(self, message: str, *, args: list[str] | None = None, stderr: str = "") -> None:
        super().__init__(message, args=args or [], stderr=stderr)
        self.stderr = stderr


class StoreUnavailable(BridgeError, OSError):
    """The SQLite store could not be opened or written (its folder's permissions, a read-only
    file system, a confined caller)."""


class RecordUnreadable(BridgeError):
    """A task's or job's stored row that this version cannot read: damaged, or written by a
    version that stored it otherwise."""

    @classmethod
    def of(cls, what: str, exc: Exception) -> RecordUnreadable:
        return cls(
            f"{what}'s stored record cannot be read ({_first_problem(exc)}): it was damaged or "
            "written by another version of worker-bridge."
        )


def _first_problem(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):  # pydantic's ValidationError, described without importing pydantic
        first = errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "the row"
        return f"{where}: {first.get('msg', 'not valid')}"
    return f"{exc.__class__.__name__}: {str(exc)[:120]}"


class SandboxError(BridgeError):
    kind = "sandbox"


class ImageMismatch(SandboxError, ValueError):
    """A node's engine holds, under an image's name, another image than the control host's
    (their ids differ): a task is never run on it (bridge/cluster/images.py)."""


class EnvironmentFailed(BridgeError):
    """The task's environment could not be made ready: its image, build, setup or cache."""

    kind = "environment"
