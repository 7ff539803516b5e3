"""The container pool: started containers made ahead of time, one per task at most.

`PooledSandbox` wraps the engine's `Sandbox` (bridge/phase/context.py puts it around every
`DockerSandbox`). With `pool.size` > 0, `start` of a worker or verification container first
claims an idle pooled container of the same shape (bridge/sandbox/pool_shape.py) from the
store's pool_slots table (a compare-and-set: one claimer wins), attaches the task's folders to
its slot and hands it the command; when there is none, the container is made cold as before.
Either way a background thread then fills the shape's slots back up to `pool.size` (off the
task's path), within `pool.max_containers` and `pool.max_memory_mb`. A pooled container is
removed with its task (`remove`) and never returns to the pool.

The slot table is shared by every process of the state root: a container made by one process
can serve the next task of any other. Whatever a killed process left (a slot it was filling,
claiming or removing, an idle one past `pool.idle_s`, a container or folder with no row) is
reclaimed by the next one (`reclaim`: by each filler and `workspaces prune`; `doctor` shows it).
A claimed container carries the pool's labels (a container's labels are fixed when it is
made): `containers` answers with the task's labels for it, so recovery, cancel and clean-up
find it as they find a cold one, and leave idle ones alone.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import os
import secrets
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.errors import BridgeError
from bridge.host.mountinfo import mount_points
from bridge.sandbox import mounts, pool_shape
from bridge.sandbox.pool_shape import (
    CONTROL,
    FIFO,
    POOLED_ROLES,
    RELEASE,
    RELEASE_TMP,
    TOKEN,
    Plan,
)
from bridge.sandbox.spec import LABEL, ContainerInfo, ContainerSpec, ExitInfo, home_id
from bridge.store.owners import Owner, new_runner_id
from bridge.store.pool import StoreError

if TYPE_CHECKING:
    from bridge.config.sections import PoolConfig
    from bridge.sandbox.protocol import Sandbox
    from bridge.store.pool import PoolSlot, PoolSlots

SLOT_LABEL = f"{LABEL}.slot"
RELEASE_WAIT_S = 2.0  # how long a claimed container's PID 1 may take to open its FIFO
RECLAIM_EVERY_S = 30.0


class _Pool:
    """This process's side of one state root's pool: its owner id, the origin of the
    containers it started, and its filler threads."""

    def __init__(self, home: Path) -> None:
        self.home, self.root = home, home / "pool"
        self.owner = Owner(id=new_runner_id().replace("runner-", "pool-"))
        self.lock = threading.Lock()
        self.origins: dict[str, dict[str, Any]] = {}
        self.filling: set[str] = set()
        self.threads: list[threading.Thread] = []
        self.reclaimed_at = 0.0


_POOLS: dict[Path, _Pool] = {}
_POOLS_LOCK = threading.Lock()


def _pool(home: Path) -> _Pool:
    with _POOLS_LOCK:
        if home not in _POOLS:
            _POOLS[home] = _Pool(home)
        return _POOLS[home]


@atexit.register
def wait_for_fillers(timeout: float = 10.0) -> None:
    """Let this process's fillers finish. At exit too (a few hundred ms at most), so that a
    process leaves started containers rather than half-made ones for the next one."""
    for pool in list(_POOLS.values()):
        for thread in list(pool.threads):
            thread.join(timeout=timeout)


def pooled(sandbox: Sandbox, slots: PoolSlots, home: Path, settings: PoolConfig) -> Sandbox:
    """``sandbox`` with the pool around it, when its containers can be pooled."""
    if isinstance(sandbox, PooledSandbox):
        sandbox = sandbox.inner
    if not getattr(sandbox, "supports_pool", False):
        return sandbox
    return PooledSandbox(sandbox, slots, home, settings)


class PooledSandbox:
    """A `Sandbox` whose task containers may come from the pool (see the module's doc)."""

    def __init__(self, inner: Sandbox, slots: PoolSlots, home: Path, settings: PoolConfig) -> None:
        self.inner, self.slots, self.home, self.settings = inner, slots, home, settings
        self.pool = _pool(home)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # -- what the pipeline sees ---------------------------------------------------------------

    def start(self, spec: ContainerSpec) -> str:
        role = spec.labels.get(f"{LABEL}.role")
        if self.settings.size <= 0 or role not in POOLED_ROLES:
            return self.inner.start(spec)
        why = pool_shape.why_not(spec)
        image = None if why else self.inner.inspect_image(spec.image)
        if why or image is None:  # no image: the cold start says so in its own words
            return self._cold(spec, why)
        plan = pool_shape.make_plan(spec, image.id)
        if isinstance(plan, str):
            return self._cold(spec, plan)
        task = spec.labels.get(f"{LABEL}.task", "")
        slot = self.slots.claim(plan.key, self.pool.owner, task, spec.labels)
        if slot is None:
            container_id = self._cold(spec, "no idle container of this shape yet")
        else:
            try:
                self._release(slot, plan)
            except (OSError, BridgeError, TimeoutError, StoreError) as exc:
                self._clear(slot, taken_from=("claimed", "running"))
                reason = f"the pooled container could not take the task ({exc})"
                container_id = self._cold(spec, reason)
            else:
                container_id = str(slot.container_id)
                self.pool.origins[container_id] = {"pooled": True, "slot": slot.slot_id}
        self.refill(plan)
        return container_id

    def origin(self, container_id: str) -> dict[str, Any] | None:
        """Whether this process's container ``container_id`` came from the pool, and if not,
        why (None: the pool is off, or the container is not a task's worker or verifier)."""
        return self.pool.origins.get(container_id)

    def wait(self, container_id: str, timeout: float | None) -> ExitInfo:
        info = self.inner.wait(container_id, timeout)
        slot = self.slots.by_container(container_id)
        if slot is not None and slot.released_at and info.finished_at:
            # The engine's start is the pool's; the command started when it was handed over.
            info.duration_s = round(max(info.finished_at - slot.released_at, 0.0), 3)
        return info

    def remove(self, container_id: str) -> None:
        self.inner.remove(container_id)
        self.pool.origins.pop(container_id, None)
        slot = self.slots.by_container(container_id)
        if slot is not None:
            self._clear(slot, taken_from=("claimed", "running", "idle"))

    def containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        found = [c for c in self.inner.containers(labels) if SLOT_LABEL not in c.labels]
        serving = [
            s for s in self.slots.running() if all(s.labels.get(k) == v for k, v in labels.items())
        ]
        if not serving:
            return found
        engine = {c.id: c for c in self._pool_containers()}
        for slot in serving:
            item = engine.get(slot.container_id or "")
            if item is not None:  # claimed: not started as the task's yet (adopt removes it)
                state = "created" if slot.state == "claimed" else item.state
                found.append(ContainerInfo(item.id, state, dict(slot.labels)))
        return found

    def remove_by_labels(self, labels: dict[str, str]) -> int:
        found = self.containers(labels)
        for item in found:
            self.remove(item.id)
        return len(found)

    # -- claiming -----------------------------------------------------------------------------

    def _cold(self, spec: ContainerSpec, why: str | None) -> str:
        container_id = self.inner.start(spec)
        self.pool.origins[container_id] = {"pooled": False, "why": why}
        return container_id

    def _release(self, slot: PoolSlot, plan: Plan) -> None:
        """Attach the task's folders to the claimed slot's points and hand its container the
        task's command: the release script written into its control folder, then its FIFO
        closed (and removed), which is when PID 1 reads the script (pool_shape's doc)."""
        folder = self.pool.root / slot.slot_id
        token = (folder / TOKEN).read_text()
        for index, mount in enumerate(plan.tops):
            _attach(mount.source, folder / f"m{index}", "", plan.points[index].kind, mount)
        for index, rel, mount in plan.nested:
            kind = "dir" if os.path.isdir(mount.source) else "file"
            _attach(mount.source, folder / f"m{index}", rel, kind, mount)
        script = pool_shape.release_script(plan, plan.spec, token).encode()
        fifo = folder / "ctl" / FIFO
        deadline, checked = time.monotonic() + RELEASE_WAIT_S, False
        while True:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                break
            except OSError as exc:  # ENXIO: no reader (yet): PID 1 has not opened it
                if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise
                if not checked:  # a container that stopped (no `sh` or `cat` in its image)
                    checked = True
                    found = self.inner.containers({SLOT_LABEL: slot.slot_id})
                    if not any(c.state == "running" for c in found):
                        raise OSError(errno.ESRCH, "the pooled container is not running") from exc
                time.sleep(0.002)
        at = time.time()
        try:
            # Marked before the command is handed over: once it is, the container is the
            # task's, found by its labels (a store that fails here leaves nothing running).
            self._check_reached(slot, plan, token)
            if not self.slots.released(slot.slot_id, at):
                raise OSError(errno.ESTALE, "the slot was taken by another process")
            # Last: whatever fails before leaves no script, and PID 1 runs nothing (125).
            pool_shape.write_release(folder / "ctl", script)
        finally:  # unlinked before the close: `cat` sees its end once nothing can open it
            _unlink(fifo)
            os.close(fd)

    def _check_reached(self, slot: PoolSlot, plan: Plan, token: str) -> None:
        """Refuse the handover (the task is then made cold) when a point still shows the
        slot's sentinel in the container (seen through /proc/PID/root): this process's mounts
        do not reach the engine's namespace (a systemd unit's namespace of its own...). Where
        the container's processes are not visible here, the release script's check stands."""
        pid = getattr(self.inner, "container_pid", lambda _: None)(str(slot.container_id))
        root = Path(f"/proc/{pid}/root")
        if not pid or not (root / CONTROL.lstrip("/") / FIFO).exists():
            return
        shown = pool_shape.sentinel_shown(root, plan, token)
        if shown is not None:
            raise OSError(
                errno.EXDEV,
                f"the task's folders did not reach the container ({shown}): this "
                "process's mounts are not seen in the engine's mount namespace",
            )

    # -- filling ------------------------------------------------------------------------------

    def prefill(self, spec: ContainerSpec) -> int:
        """Fill the shape of ``spec`` up to `pool.size` now, in this thread (the bench, tests);
        how many containers were made."""
        image = self.inner.inspect_image(spec.image)
        plan = None if image is None else pool_shape.make_plan(spec, image.id)
        if not isinstance(plan, Plan):
            return 0
        self._share_root()
        made = 0
        while self._fill_one(plan):
            made += 1
        return made

    def refill(self, plan: Plan) -> None:
        """Fill ``plan``'s shape back up to `pool.size` in a background thread (one per shape
        and process at a time)."""
        with self.pool.lock:
            if plan.key in self.pool.filling:
                return
            self.pool.filling.add(plan.key)
            thread = threading.Thread(
                target=self._fill, args=(plan,), name=f"pool-fill-{plan.key[:8]}", daemon=True
            )
            self.pool.threads = [t for t in self.pool.threads if t.is_alive()] + [thread]
        thread.start()

    def _fill(self, plan: Plan) -> None:
        # A connection of its own: the caller's store may be closed while this thread runs.
        from bridge.store.db import Store

        store = None
        try:
            store = Store(self.slots.store.path)
            own = PooledSandbox(self.inner, store.pool, self.home, self.settings)
            if time.time() - self.pool.reclaimed_at > RECLAIM_EVERY_S:
                own.reclaim()
            own._share_root()
            while own._fill_one(plan):
                pass
        except Exception:  # noqa: BLE001 - the pool is an optimisation: a cold start loses nothing
            pass  # a half-made slot is reclaimed (its owner stuck or gone)
        finally:
            if store is not None:
                store.close()
            with self.pool.lock:
                self.pool.filling.discard(plan.key)

    def _share_root(self) -> None:
        root = self.pool.root
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if mounts.shared(root):
            return
        with open(self.home / "pool.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            mounts.share(root)

    def _fill_one(self, plan: Plan) -> bool:
        slot_id = secrets.token_hex(6)
        settings = self.settings
        if not self.slots.reserve(
            slot_id,
            plan.key,
            self.pool.owner,
            plan.spec.memory_mb,
            size=settings.size,
            max_containers=settings.max_containers,
            max_memory_mb=settings.max_memory_mb,
        ):
            return False
        folder = self.pool.root / slot_id
        container_id = None
        try:
            pool_shape.make_slot(folder, plan)
            spec = pool_shape.pooled_spec(plan, folder, slot_id, self.pool.owner.id)
            container_id = self.inner.start(spec)
            if self.slots.filled(slot_id, container_id, time.time() + settings.idle_s):
                return True
        except (OSError, BridgeError):
            pass
        if container_id is not None:
            self.inner.remove(container_id)
        self._remove_folder(folder)
        self.slots.drop(slot_id)
        return False

    # -- reclaiming ---------------------------------------------------------------------------

    def reclaim(self) -> list[str]:
        """Remove what no live process holds: slots whose owner died (or is stuck) while
        filling, claiming or removing them, idle slots past their expiry or whose container
        stopped, serving slots whose container is gone, and containers and slot folders with
        no row. Returns the slot ids removed."""
        self.pool.reclaimed_at = time.time()
        before = self.slots.rows()
        folders = _listdir(self.pool.root)
        engine = self._pool_containers()
        after = {s.slot_id: s for s in self.slots.rows()}
        ids = {c.id: c for c in engine}
        now, undone = time.time(), []
        for slot in before:
            item = ids.get(slot.container_id or "")
            gone = slot.state == "running" and item is None
            expired = slot.state == "idle" and (
                item is None or item.state != "running" or (slot.expires_at or 0) <= now
            )
            if slot.owner_dead(now) or gone or expired:
                if self._clear(slot, taken_from=(slot.state,)):
                    undone.append(slot.slot_id)
        for item in engine:
            if item.labels.get(SLOT_LABEL) not in after:
                self.inner.remove(item.id)
        for name in folders:
            if name not in after:
                self._remove_folder(self.pool.root / name)
        return undone

    def drain(self) -> list[str]:
        """Reclaim, then remove every idle pooled container too (`workspaces prune`): what
        serves a task stays; the next task's start fills the pool again."""
        undone = self.reclaim()
        for slot in self.slots.rows():
            if slot.state == "idle" and self._clear(slot, taken_from=("idle",)):
                undone.append(slot.slot_id)
        return undone

    def slot_rows(self) -> list[PoolSlot]:
        return self.slots.rows()

    def _pool_containers(self) -> list[ContainerInfo]:
        everything = self.inner.containers({f"{LABEL}.home": home_id(self.home)})
        return [c for c in everything if SLOT_LABEL in c.labels]

    def _clear(self, slot: PoolSlot, taken_from: tuple[str, ...]) -> bool:
        """Take the slot (a compare-and-set) and remove its container, its mounts and its
        folder; False when another process took it first."""
        if not self.slots.take(slot.slot_id, self.pool.owner, taken_from):
            return False
        if slot.container_id:
            self.inner.remove(slot.container_id)
        else:
            for item in self._pool_containers():
                if item.labels.get(SLOT_LABEL) == slot.slot_id:
                    self.inner.remove(item.id)
        if self._remove_folder(self.pool.root / slot.slot_id):
            self.slots.drop(slot.slot_id)
        return True

    def _remove_folder(self, folder: Path) -> bool:
        """Detach every mount in a slot folder, then remove what the pool made there, entry by
        entry (never a recursive delete: a mount still attached would lead it into a task's
        files). False when something is still mounted there."""
        for point in sorted(mount_points(folder), reverse=True):
            mounts.detach(Path(point))
        if mount_points(folder):
            return False
        token = _read(folder / TOKEN)
        for name in _listdir(folder):
            path = folder / name
            if path.is_dir() and not path.is_symlink():
                for inner in (token, FIFO, RELEASE, RELEASE_TMP):
                    if inner:
                        _unlink(path / inner)
                _rmdir(path)
            else:
                _unlink(path)
        _rmdir(folder)
        return not folder.exists()


def _attach(source: Path, root: Path, rel: str, kind: str, mount: Any) -> None:
    point = mounts.open_point(root, rel, kind)
    try:
        mounts.attach(source, point, read_only=mount.read_only)
    finally:
        os.close(point)


# Slot folders' entries, read and removed without raising: a folder another process is clearing
# at the same time, or one left half-made, is not an error of this one.
def _listdir(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass
