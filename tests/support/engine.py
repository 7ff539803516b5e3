"""The Docker engine as the tests see it: which base image builds the test images, whether a
missing engine fails a test that needs it or skips it, the label namespace on everything the
bridge starts, a sampler of the running containers, and the cleanup of a state root's
containers and images."""

from __future__ import annotations

import functools
import os
import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest

BASE_IMAGE = os.environ.get("WORKER_BRIDGE_TEST_BASE_IMAGE", "worker-bridge/rootfs:bookworm")
REQUIRE_DOCKER = os.environ.get("WORKER_BRIDGE_REQUIRE_DOCKER") == "1"
LABEL = "io.worker-bridge"


@functools.cache
def engine_unreachable() -> str | None:
    """Why the engine cannot be used (None: it answers), asked once per test process."""
    from bridge.errors import BridgeError
    from bridge.sandbox import DockerSandbox

    try:
        DockerSandbox().ping()
    except BridgeError as exc:
        return str(exc)
    return None


def require_engine() -> None:
    """Skip a test that needs the engine when there is none, or fail it when the run requires
    one (WORKER_BRIDGE_REQUIRE_DOCKER=1, as in CI): a missing engine never passes silently."""
    why = engine_unreachable()
    if why is None:
        return
    if REQUIRE_DOCKER:
        pytest.fail(f"WORKER_BRIDGE_REQUIRE_DOCKER=1 but: {why}")
    pytest.skip(why)


def remove_home_artifacts(home: Path) -> None:
    """The containers a test's state root started, and the environment images it made (setup
    results and devcontainer builds are tagged per state root: nothing else would remove them)."""
    try:
        from bridge.sandbox import DockerSandbox, home_id

        sandbox = DockerSandbox()
        sandbox.remove_by_labels({f"{LABEL}.home": home_id(home)})
        made = {f"{LABEL}.home": home_id(home), f"{LABEL}.role": "environment"}
        for image in sandbox.images(made):
            sandbox.remove_image(image.id)
    except Exception:  # no engine, or it went away: nothing of ours can be left on it
        pass


def task_containers(task_id: str, **labels: str) -> list:
    """Every container (running or not) of one task, or of its containers those whose labels
    also say LABELS (role="worker", ...)."""
    import docker

    wanted = [f"{LABEL}.task={task_id}", *(f"{LABEL}.{k}={v}" for k, v in labels.items())]
    client = docker.from_env()
    try:
        found = client.containers.list(all=True, filters={"label": wanted})
        return found + _pooled(client, {f"{LABEL}.task": task_id, **labels})
    finally:
        client.close()


def _pooled(client, labels: dict[str, str]) -> list:
    """Pooled containers serving a task with ``labels`` (role=... as `role`): their engine
    labels are the pool's, fixed when they were made; the task's are in the store's slot row
    (bridge/sandbox/pool.py), found from the slot folder the container mounts."""
    from bridge.store.pool import read_slots

    wanted = {k if k.startswith(LABEL) else f"{LABEL}.{k}": v for k, v in labels.items()}
    found = []
    for container in client.containers.list(all=True, filters={"label": [f"{LABEL}.slot"]}):
        slot_id = container.labels[f"{LABEL}.slot"]
        for mount in container.attrs.get("Mounts") or []:
            source = Path(mount.get("Source", ""))
            if source.name == "ctl" and source.parent.name == slot_id:
                rows = read_slots(source.parent.parent.parent / "bridge.db")
                row = next((r for r in rows if r.slot_id == slot_id), None)
                if row is not None and all(row.labels.get(k) == v for k, v in wanted.items()):
                    found.append(container)
    return found


class EngineSampler:
    """Samples, in a background thread, the running containers of one state root:
    each sample is a list of (task id, role)."""

    def __init__(self, home: Path) -> None:
        import docker

        from bridge.sandbox import home_id

        self.client = docker.from_env()
        self.store_path = home / "bridge.db"
        self.filters = {"label": [f"{LABEL}.home={home_id(home)}"]}
        self.samples: list[list[tuple[str, str]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-sampler", daemon=True)

    def __enter__(self) -> EngineSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                found = self.client.containers.list(sparse=True, filters=self.filters)
            except Exception as exc:  # an engine hiccup must not kill the sampler silently
                self.errors.append(repr(exc))
            else:
                sample = []
                slots = None
                for c in found:
                    labels = c.attrs.get("Labels") or {}
                    if f"{LABEL}.slot" in labels:  # pooled: the task's labels are in its row
                        from bridge.store.pool import read_slots

                        if slots is None:
                            slots = {r.slot_id: r for r in read_slots(self.store_path)}
                        row = slots.get(labels[f"{LABEL}.slot"])
                        if row is None or row.state != "running":
                            continue  # idle (or being made): no task's, bounded by pool.* instead
                        labels = row.labels
                    if c.attrs.get("State", "running") == "running":
                        sample.append((labels.get(f"{LABEL}.task"), labels.get(f"{LABEL}.role")))
                self.samples.append(sample)
            self._stop.wait(0.05)

    def max_count(self, keep=lambda task, role: role == "worker") -> int:
        return max((sum(1 for t, r in s if keep(t, r)) for s in self.samples), default=0)

    def max_per(self, group, role: str = "worker") -> dict[str, int]:
        """Largest number of ``role`` containers seen at once per group(task id)."""
        best: dict[str, int] = defaultdict(int)
        for s in self.samples:
            counts = Counter(group(t) for t, r in s if r == role)
            for key, n in counts.items():
                best[key] = max(best[key], n)
        return dict(best)
