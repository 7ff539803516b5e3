"""What `workers list` (and `list_workers`) says of each worker: whether its image is in the
engine, whether it can run a task here now, and why not in one sentence, and its circuit
breaker (which may refuse new tasks for it although it is healthy: bridge/workers/circuit.py)."""

from __future__ import annotations

from bridge.config.settings import Config
from bridge.errors import BridgeError
from bridge.records import WorkerInfo
from bridge.sandbox import Sandbox
from bridge.workers import all_workers
from bridge.workers.circuit import circuits_of


def worker_infos(config: Config, sandbox: Sandbox) -> list[WorkerInfo]:
    workers = all_workers(config)
    circuits = circuits_of(config, workers)  # writes only to settle a probe that is over
    try:
        sandbox.ping()
        engine = True
    except BridgeError:
        engine = False
    out = []
    for name, worker in sorted(workers.items()):
        image = worker.image(config)
        labels = sandbox.image_labels(image) if engine else None
        installed = labels is not None
        problem = worker.health(config)
        if not engine:
            reason: str | None = "The container engine cannot be reached."
        elif not installed:
            target = worker.build_target
            how = f"`worker-bridge images build {target}`" if target else "build or load it"
            reason = f"Image {image} is not present; {how}."
        else:
            reason = problem
        out.append(
            WorkerInfo(
                name=name,
                installed=installed,
                healthy=installed and problem is None,
                image=image,
                capabilities=list(worker.capabilities),
                cli_version=(labels or {}).get("io.worker-bridge.cli-version"),
                reason=reason,
                circuit=circuits[name].document(),
            )
        )
    return out
