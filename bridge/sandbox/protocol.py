"""The `Sandbox` protocol: what the pipeline needs from a container engine, and nothing more.

`DockerSandbox` implements it for a local Docker engine; `FakeSandbox` runs "containers" as local
processes (or scripted outcomes) so the pipeline's logic can be tested without an engine. A
cluster backend would be a third implementation: the pipeline, service and workers see only this.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from bridge.errors import ImageMissing
from bridge.sandbox.spec import ContainerInfo, ContainerSpec, ExitInfo, ImageInfo


@runtime_checkable
class Sandbox(Protocol):
    def ping(self) -> str:
        """The engine's version; EngineUnavailable when it cannot be reached."""
        ...

    def runtimes(self) -> dict[str, list[str]]:
        """The container runtimes the engine has registered (runc, runsc...), each with the
        arguments the engine passes it."""
        ...

    def image_present(self, ref: str) -> bool: ...

    def image_labels(self, ref: str) -> dict[str, str] | None:
        """The image's labels, or None when it is not present."""
        ...

    def inspect_image(self, ref: str) -> ImageInfo | None:
        """The image's id, labels and environment, or None when it is not present."""
        ...

    def known_image(self, ref: str) -> ImageInfo | None:
        """`inspect_image`, or what it found earlier in this task's run (`resolved_once`):
        for an image the run only needs to exist and be the one it started with."""
        ...

    def images(self, labels: dict[str, str]) -> list[ImageInfo]:
        """Images carrying all ``labels`` (their environments are not filled in)."""
        ...

    def remove_image(self, ref: str) -> None:
        """Remove an image (or one tag of it); one already gone is not an error."""
        ...

    def build_image(
        self,
        tag: str,
        context: bytes,
        *,
        buildargs: dict[str, str],
        labels: dict[str, str],
        on_line: Callable[[str], None],
        dockerfile: str = "Dockerfile",
        target: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Build ``tag`` from a tar build context; BridgeError naming the failing step (or
        saying the build was silent for ``timeout`` seconds, when given)."""
        ...

    def commit(self, container_id: str, tag: str, labels: dict[str, str]) -> str:
        """Keep a stopped container's root filesystem as image ``tag``; its id. The image keeps
        the container's configuration, its environment variables included."""
        ...

    def written_bytes(self, container_id: str) -> int | None:
        """What a container wrote to its own filesystem layer (None when unknown)."""
        ...

    def export_path(self, image: str, path: str, dest: Path) -> None:
        """Copy the folder ``path`` of ``image`` to ``dest`` on this host (as its last name)."""
        ...

    def start(self, spec: ContainerSpec) -> str:
        """Create and start a container; its id. Nothing is left behind when this fails."""
        ...

    def output(
        self,
        container_id: str,
        *,
        since: float | None = None,
        stdout: bool = True,
        stderr: bool = True,
        tail: int | None = None,
    ) -> Iterator[bytes]:
        """The container's output as it arrives (the streams asked for), from the start or
        from ``since`` (epoch seconds), until it exits. Raw chunks: bounding what is kept is
        the reader's job (see `bridge.sandbox.output`). With ``tail``: only the last ``tail``
        lines the engine kept, at once, without following (what a live stream may have missed
        at the end: an engine's log rotation can end its follower early)."""
        ...

    def wait(self, container_id: str, timeout: float | None) -> ExitInfo:
        """Wait for exit; past ``timeout`` the container is killed with everything in it. A
        container removed meanwhile (a cancel from another process) ends with exit_code None."""
        ...

    def kill(self, container_id: str) -> None: ...

    def remove(self, container_id: str) -> None:
        """Remove (killing first); a container already gone is not an error."""
        ...

    def containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        """Containers in any state carrying all ``labels``."""
        ...

    def remove_by_labels(self, labels: dict[str, str]) -> int: ...


def require_image(sandbox: Sandbox, ref: str, build_target: str | None) -> None:
    """ImageMissing naming the command that builds ``ref`` (or how to provide it)."""
    if sandbox.image_present(ref):
        return
    if build_target:
        how = f"build it with `worker-bridge images build {build_target}`"
    else:
        how = "build or load it into this engine first (images are never pulled)"
    raise ImageMissing(f"Image {ref} is not present; {how}.")
