"""Capacity: which lease scopes a task needs, and waiting for them in start order (priority,
then age) while the task is still wanted.

The limits are read here and only here, from the configuration recorded with the task: a task
starts when fewer than *its* limit of containers hold leases in each of its scopes, whichever
process runs it (see docs/concurrency.md)."""

from __future__ import annotations

import time
from collections.abc import Callable

from bridge.config.settings import Config
from bridge.records import TaskRecord
from bridge.store import Store
from bridge.store.owners import Owner

LEASE_TTL = 10.0
HEARTBEAT_EVERY = 2.0
# A waiting task looks again when the store changed (a lease released, a task queued or
# cancelled), at most every CHECK_MIN_S, and at least every CHECK_MAX_S (a lease freed by time:
# expired, or its owner found dead); whether it changed is asked every POLL_S.
POLL_S = 0.02
CHECK_MIN_S = 0.05
CHECK_MAX_S = 0.5


def task_scopes(config: Config, repository: str, worker: str) -> dict[str, int]:
    """scope -> limit for one task: the host, its repository and, if limited, its worker."""
    scopes = {"global": config.max_concurrency, f"repo:{repository}": config.repo_concurrency}
    limit = config.worker_concurrency.get(worker)
    if limit:
        scopes[f"worker:{worker}"] = limit
    return scopes


def wait_for_leases(
    store: Store,
    task: TaskRecord,
    owner: Owner,
    *,
    still_wanted: Callable[[], bool],
    ahead_of_queue: bool = False,
    on_idle: Callable[[], object] | None = None,
) -> bool:
    """Block until the task holds a lease in each of its scopes; False if it stopped being
    wanted (cancelled) meanwhile. ``ahead_of_queue``: a resumed task goes before queued ones.
    Tasks queued ahead are counted with this task's limits."""
    config = task.config
    scopes = task_scopes(config, task.repository, task.worker)
    last_idle = time.monotonic()
    seen, checked_at = None, float("-inf")
    while True:
        now = time.monotonic()
        since = now - checked_at
        # Read before looking: a change made while this one looks is seen on the next round.
        generation = store.generation() if since >= CHECK_MIN_S else seen
        if since < CHECK_MIN_S or (generation == seen and since < CHECK_MAX_S):
            time.sleep(POLL_S)
            continue
        seen, checked_at = generation, now
        waiting = (
            []
            if ahead_of_queue
            else [
                (row["task_id"], task_scopes(config, row["repository"], row["worker"]))
                for row in store.leases.queued_waiting()
            ]
        )
        if store.leases.acquire(task.task_id, owner, scopes, LEASE_TTL, waiting):
            return True
        if not still_wanted():
            return False
        if on_idle and time.monotonic() - last_idle > 2.0:
            on_idle()
            last_idle = time.monotonic()
