"""`worker-bridge doctor`'s checks: can tasks run here? One actionable line per problem, each a
`Check` (`{check, ok, detail, severity}`). Nothing is written (the store's write lock is
taken and let go); `WorkerBridge.doctor` runs them and the CLI prints them."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path
from typing import TypedDict

from bridge.config.settings import Config
from bridge.errors import BridgeError
from bridge.host.state_root import exposure
from bridge.sandbox import Sandbox
from bridge.sandbox.host_paths import deployment_checks
from bridge.sandbox.runtimes import runtime_check
from bridge.store import store_writable
from bridge.store.pool import read_slots
from bridge.workers import all_workers
from bridge.workers.circuit import circuits_of


class Check(TypedDict):
    """One of doctor's checks: what it checked, whether it passed, one actionable line, and how
    much a failure matters: "ok" when it passed, else "error" (tasks cannot run) or
    "warning"."""

    check: str
    ok: bool
    detail: str
    severity: str


def _check(name: str, ok: bool, detail: str, severity: str = "error") -> Check:
    return Check(check=name, ok=ok, detail=detail, severity="ok" if ok else severity)


SUBORDINATE_FILES = ("/etc/subuid", "/etc/subgid")


def health_checks(config: Config, sandbox: Sandbox) -> list[Check]:
    engine = _engine(sandbox)
    checks = [engine, _store(config), _state_root(config), _sandbox_uid(config)]
    if engine["ok"]:
        checks += _images(config, sandbox)
        checks += _runtime(config, sandbox)
        checks += [_check(*found) for found in deployment_checks(config.home)]  # in a container
    checks += _workers(config)
    checks += _pool(config)
    checks.append(_disk(config))
    return checks


def _engine(sandbox: Sandbox) -> Check:
    try:
        return _check("engine", True, f"Docker engine {sandbox.ping()} reachable")
    except BridgeError as exc:
        return _check("engine", False, exc.message)


def _store(config: Config) -> Check:
    """Checked without writing: doctor leaves the store (and a state root without one) as it
    is."""
    problem = store_writable(config.store_path)
    if problem is None:
        return _check("store", True, f"store {config.store_path} writable")
    return _check(
        "store",
        False,
        f"store {config.store_path} is not writable ({problem}); fix its permissions or set "
        "WORKER_BRIDGE_STORE.",
    )


def _state_root(config: Config) -> Check:
    """Whether other local users can enter the state root (said, not repaired: the bridge
    repairs it on its next use)."""
    home = config.home
    problem = exposure(home)
    if problem is None:
        return _check("state_root", True, f"state root {home} is this user's alone (0700)")
    return _check(
        "state_root",
        False,
        f"other local users can reach into the state root ({problem}); the bridge makes it "
        f"0700 on its next use, or run `chmod 700 {home}` (a folder of another user's: set "
        "WORKER_BRIDGE_HOME to one of this user's own).",
        "warning",
    )


def _sandbox_uid(config: Config) -> Check:
    """A root bridge runs its containers as `sandbox_uid`: a host account with that uid has
    what a process of a container's uid has over it (its files through /proc, signals, ptrace
    where the kernel allows it), so no account should have it."""
    uid = config.sandbox_uid
    if os.geteuid() != 0:
        detail = f"containers run as this user (uid {os.geteuid()}); sandbox_uid is a root bridge's"
        return _check("sandbox_uid", True, detail)
    holder: str | None
    try:
        holder = f"the host account '{pwd.getpwuid(uid).pw_name}'"
    except KeyError:
        holder = subordinate_holder(uid)
    if holder is None:
        return _check("sandbox_uid", True, f"sandbox_uid {uid} is no host account's")
    return _check(
        "sandbox_uid",
        False,
        f"sandbox_uid {uid} is {holder}: its processes can reach a running task's containers "
        "(their files through /proc, ptrace where the kernel allows it) and so its checks; set "
        "`sandbox_uid` in config.yaml to a uid no account uses.",
        "warning",
    )


def subordinate_holder(uid: int, files: tuple[str, ...] = SUBORDINATE_FILES) -> str | None:
    """Who may take ``uid`` as a subordinate id (/etc/subuid, /etc/subgid: a user of rootless
    containers or user namespaces becomes any uid of their range), said in a few words; None
    when no range holds it."""
    for path in files:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            owner, _, rest = line.strip().partition(":")
            start, _, count = rest.partition(":")
            if start.isdigit() and count.isdigit() and int(start) <= uid < int(start) + int(count):
                return f"in the range {path} gives '{owner}' (rootless containers)"
    return None


def _images(config: Config, sandbox: Sandbox) -> list[Check]:
    checks = []
    for name, ref in (("mock", config.image_for("mock")), ("verify", config.verify_image_ref)):
        if sandbox.image_present(ref):
            checks.append(_check(f"image:{name}", True, f"{ref} present"))
        else:
            build = f"run `worker-bridge images build {name}`"
            checks.append(_check(f"image:{name}", False, f"{ref} is missing; {build}."))
    return checks


def _runtime(config: Config, sandbox: Sandbox) -> list[Check]:
    registered = sandbox.runtimes()
    if config.runtime:
        return [_check("runtime", *runtime_check(config.runtime, registered))]
    if "runsc" not in registered:
        return []
    usable, why = runtime_check("runsc", registered)  # not in use: whether it could be
    if usable:
        why = (
            "gVisor (runsc) is registered and usable; `runtime: runsc` in config.yaml runs "
            "tasks in it"
        )
    return [_check("runtime", usable, why, "warning")]


def _workers(config: Config) -> list[Check]:
    """A worker that cannot reach its model (a route's key missing) is a warning: the others
    run. So is one whose circuit breaker refuses new tasks (read; written only to settle a
    probe)."""
    workers = all_workers(config)
    checks = []
    for name, worker in sorted(workers.items()):
        problem = worker.health(config)
        if problem is not None:
            checks.append(_check(f"worker:{name}", False, problem, "warning"))
    try:
        circuits = circuits_of(config, workers)
    except BridgeError as exc:  # a store that cannot be read: said, and the other checks go on
        return [*checks, _check("circuits", False, exc.message)]
    for name, circuit in sorted(circuits.items()):
        if not circuit.admits:
            checks.append(_check(f"circuit:{name}", False, circuit.refusal(), "warning"))
    return checks


def _pool(config: Config) -> list[Check]:
    try:
        slots = read_slots(config.store_path)
    except BridgeError as exc:  # said once, as for the circuits
        return [_check("pool", False, exc.message)]
    if not slots and not config.pool.size:
        return []
    idle = sum(1 for r in slots if r.state == "idle")
    running = sum(1 for r in slots if r.state == "running")
    other = len(slots) - idle - running
    detail = f"container pool (size {config.pool.size}): {idle} idle, {running} serving a task"
    if other:
        detail += (
            f", {other} being made or removed (`workspaces prune` clears what a killed "
            "process left)"
        )
    return [_check("pool", other == 0, detail, "warning")]


def _disk(config: Config) -> Check:
    existing = next(p for p in (config.home, *config.home.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    return _check(
        "disk", free > 2 * 2**30, f"{free / 2**30:.1f} GiB free under {config.home}", "warning"
    )
