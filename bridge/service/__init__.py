"""The library facade the front ends share: `WorkerBridge` (facade.py) with its verbs on jobs
(jobs.py), and `doctor`'s checks (doctor.py)."""

from bridge.service.facade import WorkerBridge

__all__ = ["WorkerBridge"]
