"""`worker-bridge doctor`'s checks: can tasks run here? One actionable line per problem, each
`{check, ok, detail, severity}`. Nothing is written (the store's write lock is taken and let
go); `WorkerBridge.doctor` runs them and the CLI prints them."""

from __future__ import annotations

import shutil
from typing import TypedDict

from bridge.config.settings import Config
from bridge.errors import BridgeError
from bridge.sandbox import Sandbox
from bridge.sandbox.host_paths import deployment_checks
from bridge.sandbox.runtimes import runtime_check
from bridge.store import store_writable
from bridge.store.pool import read_slots
from bridge.workers import all_workers
from bridge.workers.circuit import circuits_of


class Check(TypedDict):
    """One of doctor's checks: what it checked, whether it passed, one actionable line, and
    how much a failure matters (ok, warning or error)."""

    check: str
    ok: bool
    detail: str
    severity: str


def health_checks(config: Config, sandbox: Sandbox) -> list[Check]:
    checks: list[Check] = []

    def add(name: str, ok: bool, detail: str, severity: str = "error") -> None:
        checks.append(Check(check=name, ok=ok, detail=detail, severity="ok" if ok else severity))

    try:
        version = sandbox.ping()
        add("engine", True, f"Docker engine {version} reachable")
        engine = True
    except BridgeError as exc:
        add("engine", False, exc.message)
        engine = False
    # Checked without writing: doctor leaves the store (and a state root without one) as it is.
    problem = store_writable(config.store_path)
    if problem is None:
        add("store", True, f"store {config.store_path} writable")
    else:
        add(
            "store",
            False,
            f"store {config.store_path} is not writable ({problem}); fix its "
            "permissions or set WORKER_BRIDGE_STORE.",
        )
    if engine:
        for name, ref in (("mock", config.image_for("mock")), ("verify", config.verify_image_ref)):
            present = sandbox.image_present(ref)
            add(
                f"image:{name}",
                present,
                f"{ref} present"
                if present
                else f"{ref} is missing; run `worker-bridge images build {name}`.",
            )
        registered = sandbox.runtimes()
        if config.runtime:
            add("runtime", *runtime_check(config.runtime, registered))
        elif "runsc" in registered:  # not in use: say whether it could be
            usable, why = runtime_check("runsc", registered)
            add(
                "runtime",
                usable,
                "gVisor (runsc) is registered and usable; `runtime: runsc` in config.yaml "
                "runs tasks in it"
                if usable
                else why,
                "warning",
            )
        for name, ok, detail in deployment_checks(config.home):  # only in a container
            add(name, ok, detail)
    # A worker that cannot reach its model (a route's key missing) is a warning: the others run.
    workers = all_workers(config)
    for name, worker in sorted(workers.items()):
        problem = worker.health(config)
        if problem is not None:
            add(f"worker:{name}", False, problem, "warning")
    # So is one whose circuit breaker refuses new tasks (read; written only to settle a probe).
    try:
        circuits = circuits_of(config, workers)
    except BridgeError as exc:  # a store that cannot be read: said, and the other checks go on
        circuits = {}
        add("circuits", False, exc.message)
    for name, circuit in sorted(circuits.items()):
        if not circuit.admits:
            add(f"circuit:{name}", False, circuit.refusal(), "warning")
    try:
        slots = read_slots(config.store_path)
    except BridgeError as exc:  # said once, as for the circuits
        slots = None
        add("pool", False, exc.message)
    if slots is not None and (slots or config.pool.size):
        states = {s: sum(1 for r in slots if r.state == s) for s in ("idle", "running")}
        other = len(slots) - sum(states.values())
        add(
            "pool",
            other == 0,
            f"container pool (size {config.pool.size}): {states['idle']} idle, "
            f"{states['running']} serving a task"
            + (
                f", {other} being made or removed (`workspaces prune` clears what a killed "
                "process left)"
                if other
                else ""
            ),
            "warning",
        )
    existing = next(p for p in (config.home, *config.home.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    add("disk", free > 2 * 2**30, f"{free / 2**30:.1f} GiB free under {config.home}", "warning")
    return checks
