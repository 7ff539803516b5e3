"""`FakeSandbox`: the `Sandbox` protocol without an engine, for tests of the pipeline's logic.

A "container" is either a local process started in the host folder mounted at its workdir (mount
targets in its argv and environment are translated to their host sources, so the mock worker and
verification commands run unchanged), or a scripted outcome (`Scripted`: exit status, output,
out-of-memory, how long it runs, and an effect on the mounted folders). It isolates nothing and
enforces no limit: it exists so that transitions, recovery decisions, repair budgets, redaction
and limits bookkeeping can be tested in milliseconds. Docker tests cover what only an engine shows.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bridge.errors import EngineUnavailable, ImageMissing, SandboxError
from bridge.sandbox.spec import ContainerInfo, ContainerSpec, ContainerState, ExitInfo, ImageInfo

_MOCK_WORKER = Path(__file__).resolve().parents[1] / "images" / "mock" / "mock-worker"


@dataclass
class Scripted:
    """What a scripted container does: ``effect`` runs at start with a function that maps a path
    inside the container to the host, then the container "runs" for ``run_for`` seconds and
    exits with ``exit_code`` after printing ``output`` (and ``stderr``)."""

    exit_code: int = 0
    output: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    oom_killed: bool = False
    run_for: float = 0.0
    effect: Callable[[Callable[[str], Path]], None] | None = None
    # The live stream ends after this many chunks, as a real engine's log follower can when
    # its log file rotates under a fast writer; the rest is only in the kept log (``tail``).
    stream_ends_after: int | None = None


# Decides how a container runs: a Scripted outcome, or None to run it as a local process.
Behaviour = Callable[[ContainerSpec], Scripted | None]


@dataclass
class _Container:
    id: str
    spec: ContainerSpec
    started: float
    chunks: list[tuple[str, bytes, float]] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    scripted: Scripted | None = None
    exit_code: int | None = None
    finished: float | None = None
    removed: bool = False
    killed: bool = False
    home: tempfile.TemporaryDirectory | None = None
    done: threading.Condition = field(default_factory=threading.Condition)

    @property
    def state(self) -> ContainerState:
        return "exited" if self.finished is not None else "running"


class FakeSandbox:
    """An in-process stand-in for a container engine (see the module docstring)."""

    def __init__(
        self,
        behaviour: Behaviour | None = None,
        *,
        missing_images: Iterable[str] = (),
        executables: dict[str, list[str]] | None = None,
        runtimes: Iterable[str] = ("runc",),
        reachable: bool = True,
    ) -> None:
        self.behaviour = behaviour or (lambda spec: None)
        self.missing_images = set(missing_images)
        self.executables = {"mock-worker": [sys.executable, str(_MOCK_WORKER)]}
        self.executables.update(executables or {})
        self._runtimes = list(runtimes)
        self.reachable = reachable
        self.started: list[ContainerSpec] = []  # every spec started, in order (for tests)
        self.built: list[str] = []
        self._containers: dict[str, _Container] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    # -- engine and images ------------------------------------------------------------------

    def _check(self) -> None:
        if not self.reachable:
            raise EngineUnavailable("Cannot reach the (fake) engine.")

    def ping(self) -> str:
        self._check()
        return "fake"

    def runtimes(self) -> dict[str, list[str]]:
        return {name: [] for name in self._runtimes}

    def image_present(self, ref: str) -> bool:
        self._check()
        return ref not in self.missing_images

    def image_labels(self, ref: str) -> dict[str, str] | None:
        return {} if self.image_present(ref) else None

    def known_image(self, ref: str) -> ImageInfo | None:
        return self.inspect_image(ref)

    def inspect_image(self, ref: str) -> ImageInfo | None:
        if not self.image_present(ref):
            return None
        digest = hashlib.sha256(ref.encode()).hexdigest()
        return ImageInfo(id=f"sha256:{digest}", labels={}, env={}, tags=(ref,))

    def images(self, labels: dict[str, str]) -> list[ImageInfo]:
        self._check()
        return []

    def remove_image(self, ref: str) -> None:
        self._check()
        self.missing_images.add(ref)

    def build_image(  # noqa: ANN001
        self,
        tag,
        context,
        *,
        buildargs,
        labels,
        on_line,
        dockerfile="Dockerfile",
        target=None,
        timeout=None,
    ) -> None:
        self._check()
        self.built.append(tag)
        self.missing_images.discard(tag)
        on_line(f"(fake) built {tag}")

    def commit(self, container_id: str, tag: str, labels: dict[str, str]) -> str:
        self._check()
        self.missing_images.discard(tag)
        return f"sha256:{hashlib.sha256(tag.encode()).hexdigest()}"

    def written_bytes(self, container_id: str) -> int | None:
        return 0

    def export_path(self, image: str, path: str, dest: Path) -> None:
        self._check()
        (dest / Path(path).name / "bin").mkdir(parents=True, exist_ok=True)

    # -- containers -------------------------------------------------------------------------

    def start(self, spec: ContainerSpec) -> str:
        self._check()
        if spec.image in self.missing_images:
            raise ImageMissing(f"Image {spec.image} is not present; build it first.")
        container = _Container(id=f"fake{next(self._ids):08d}" + "0" * 52, spec=spec, started=0)
        container.started = time.time()
        with self._lock:
            self._containers[container.id] = container
        self.started.append(spec)
        scripted = self.behaviour(spec)
        if scripted is not None:
            self._run_scripted(container, scripted)
            return container.id
        try:
            self._run_process(container)
        except OSError as exc:  # its command or working folder is not there
            # As an engine whose start fails: nothing left behind, the error in our words.
            with self._lock:
                self._containers.pop(container.id, None)
            if container.home is not None:
                container.home.cleanup()
            raise SandboxError(f"Could not start the container: {exc}") from exc
        return container.id

    def _host_path(self, spec: ContainerSpec, path: str) -> Path:
        for mount in sorted(spec.mounts, key=lambda m: len(m.target), reverse=True):
            if path == mount.target or path.startswith(mount.target.rstrip("/") + "/"):
                return Path(str(mount.source) + path[len(mount.target) :])
        return Path(path)

    def _translate(self, spec: ContainerSpec, value: str) -> str:
        return str(self._host_path(spec, value)) if value.startswith("/") else value

    def _run_scripted(self, container: _Container, scripted: Scripted) -> None:
        container.scripted = scripted
        if scripted.effect is not None:
            scripted.effect(lambda path: self._host_path(container.spec, path))
        now = time.time()
        for line in scripted.output:
            container.chunks.append(("stdout", line.encode() + b"\n", now))
        for line in scripted.stderr:
            container.chunks.append(("stderr", line.encode() + b"\n", now))
        if scripted.run_for <= 0:
            self._finish(container, scripted.exit_code)
        else:
            timer = threading.Timer(scripted.run_for, self._finish, (container, scripted.exit_code))
            timer.daemon = True
            timer.start()

    def _run_process(self, container: _Container) -> None:
        spec = container.spec
        argv = list(self.executables.get(spec.command[0], spec.command[:1])) + [
            self._translate(spec, arg) for arg in spec.command[1:]
        ]
        container.home = tempfile.TemporaryDirectory(prefix="fake-home-")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        env.update({key: self._translate(spec, value) for key, value in spec.env.items()})
        env["HOME"] = container.home.name
        env.update(self._git_env(spec))
        container.proc = proc = subprocess.Popen(
            argv,
            cwd=self._host_path(spec, spec.workdir),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        readers = [
            threading.Thread(target=self._pump, args=(container, name, pipe), daemon=True)
            for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr))
        ]
        for reader in readers:
            reader.start()

        def reap() -> None:
            code = proc.wait()
            for reader in readers:
                reader.join()
            self._finish(container, 128 - code if code < 0 else code)

        threading.Thread(target=reap, daemon=True).start()

    def _git_env(self, spec: ContainerSpec) -> dict[str, str]:
        """Point git at the container's private git dir, as the mounted `.git` file does."""
        for mount in spec.mounts:
            if mount.target == spec.workdir.rstrip("/") + "/.git" and Path(mount.source).is_file():
                text = Path(mount.source).read_text().strip()
                gitdir = self._host_path(spec, text.removeprefix("gitdir:").strip())
                alternates = gitdir / "objects" / "info" / "alternates"
                env = {
                    "GIT_DIR": str(gitdir),
                    "GIT_WORK_TREE": str(self._host_path(spec, spec.workdir)),
                }
                if alternates.is_file():
                    lines = [ln for ln in alternates.read_text().splitlines() if ln]
                    env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = os.pathsep.join(
                        self._translate(spec, line) for line in lines
                    )
                return env
        return {}

    def _pump(self, container: _Container, name: str, pipe) -> None:  # noqa: ANN001
        for chunk in iter(lambda: pipe.read1(65536), b""):
            with container.done:
                container.chunks.append((name, chunk, time.time()))
                container.done.notify_all()

    def _finish(self, container: _Container, code: int) -> None:
        with container.done:
            if container.finished is None:
                container.exit_code = code
                container.finished = time.time()
            container.done.notify_all()
        if container.home is not None:
            container.home.cleanup()

    def _get(self, container_id: str) -> _Container | None:
        """By id, or by a unique prefix of it (as engines accept short ids)."""
        with self._lock:
            if container_id in self._containers:
                return self._containers[container_id]
            found = [c for key, c in self._containers.items() if key.startswith(container_id)]
            return found[0] if len(found) == 1 else None

    def output(
        self,
        container_id: str,
        *,
        since: float | None = None,
        stdout: bool = True,
        stderr: bool = True,
        tail: int | None = None,
    ) -> Iterator[bytes]:
        container = self._get(container_id)
        if container is None:
            return
        wanted = {name for name, on in (("stdout", stdout), ("stderr", stderr)) if on}
        if tail is not None:
            with container.done:
                kept = b"".join(c for name, c, _ in container.chunks if name in wanted)
            lines = kept.splitlines(keepends=True)
            yield b"".join(lines[-tail:])
            return
        cut = container.scripted.stream_ends_after if container.scripted else None
        i = delivered = 0
        while True:
            with container.done:
                while i >= len(container.chunks) and container.finished is None:
                    container.done.wait(0.5)
                batch = container.chunks[i:]
                i = len(container.chunks)
                over = container.finished is not None
            for name, chunk, at in batch:
                if cut is not None and delivered >= cut:
                    return
                if name in wanted and (since is None or at >= since):
                    delivered += 1
                    yield chunk
            if over and i >= len(container.chunks):
                return

    def wait(self, container_id: str, timeout: float | None) -> ExitInfo:
        container = self._get(container_id)
        if container is None:
            return ExitInfo(exit_code=None, oom_killed=False)
        deadline = None if timeout is None else time.time() + timeout
        with container.done:
            while container.finished is None:
                left = None if deadline is None else deadline - time.time()
                if left is not None and left <= 0:
                    break
                container.done.wait(min(left or 0.5, 0.5))
        timed_out = container.finished is None
        if timed_out:
            self.kill(container_id)
            with container.done:
                while container.finished is None:
                    container.done.wait(0.5)
        if container.removed:
            return ExitInfo(exit_code=None, oom_killed=False, timed_out=timed_out)
        oom = bool(container.scripted and container.scripted.oom_killed)
        return ExitInfo(
            exit_code=container.exit_code,
            oom_killed=oom,
            timed_out=timed_out,
            duration_s=round((container.finished or time.time()) - container.started, 3),
        )

    def kill(self, container_id: str) -> None:
        container = self._get(container_id)
        if container is None or container.finished is not None:
            return
        container.killed = True
        if container.proc is not None:
            try:
                os.killpg(container.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            self._finish(container, 137)

    def remove(self, container_id: str) -> None:
        container = self._get(container_id)
        if container is None:
            return
        container.removed = True
        self.kill(container.id)
        with self._lock:
            self._containers.pop(container.id, None)

    def containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        self._check()
        with self._lock:
            found = list(self._containers.values())
        return [
            ContainerInfo(c.id, c.state, dict(c.spec.labels))
            for c in found
            if all(c.spec.labels.get(k) == v for k, v in labels.items())
        ]

    def remove_by_labels(self, labels: dict[str, str]) -> int:
        found = self.containers(labels)
        for item in found:
            self.remove(item.id)
        return len(found)
