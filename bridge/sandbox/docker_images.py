"""The image half of `DockerSandbox`: looking images up, listing, removing, committing a
container to one, reading a folder out of one and building one (bridge/sandbox/docker.py has
the containers). Engine errors go through engine.call."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
import urllib3.exceptions

from bridge.errors import BridgeError, SandboxError
from bridge.sandbox.engine import call, engine_down
from bridge.sandbox.output import ChunkReader
from bridge.sandbox.spec import ImageInfo

# A task's run asks the engine about the same few images within milliseconds: its preflight
# and its worker's bundle the worker's image, the permission check and its environment the
# environment's image. Inside `resolved_once` (one run, in its own thread) what `inspect_image`
# found is kept, and `known_image` (the presence checks, the environment's image, the bundle's)
# answers from it. Everything else asks the engine each time: a cache entry's image, which
# another process may make again, and the pool's. A build, commit or removal in this run's
# thread clears what was kept, and an image not found is asked for again.
_FOUND: ContextVar[dict[str, ImageInfo] | None] = ContextVar("found_images", default=None)


@contextmanager
def resolved_once() -> Iterator[None]:
    token = _FOUND.set({})
    try:
        yield
    finally:
        _FOUND.reset(token)


def _forget() -> None:
    found = _FOUND.get()
    if found is not None:
        found.clear()


def image_info(attrs: dict) -> ImageInfo:
    config = attrs.get("Config") or {}
    env = {}
    for item in config.get("Env") or ():
        name, _, value = item.partition("=")
        env[name] = value
    return ImageInfo(
        id=str(attrs["Id"]),
        labels=dict(config.get("Labels") or {}),
        env=env,
        tags=tuple(attrs.get("RepoTags") or ()),
        size=int(attrs.get("Size") or 0),
        created=str(attrs.get("Created") or ""),
    )


class DockerImages:
    """Needs ``client`` (a docker-py client) and ``remove`` (a container), as DockerSandbox has."""

    client: Any

    def remove(self, container_id: str) -> None: ...

    def image_present(self, ref: str) -> bool:
        return self.known_image(ref) is not None

    def image_labels(self, ref: str) -> dict[str, str] | None:
        found = self.inspect_image(ref)
        return None if found is None else dict(found.labels)

    def known_image(self, ref: str) -> ImageInfo | None:
        found = _FOUND.get()
        if found is not None and ref in found:
            return found[ref]
        return self.inspect_image(ref)

    def inspect_image(self, ref: str) -> ImageInfo | None:
        found = _FOUND.get()
        attrs = call(
            f"inspect image {ref}",
            self.client.api.inspect_image,
            ref,
            tolerate=(404,),
            retried=True,
        )
        if attrs is None:
            return None
        info = image_info(attrs)
        if found is not None:
            found[ref] = info
        return info

    def images(self, labels: dict[str, str]) -> list[ImageInfo]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        found = call("list images", self.client.api.images, filters=filters, retried=True)
        return [
            ImageInfo(
                id=item["Id"],
                labels=dict(item.get("Labels") or {}),
                env={},
                tags=tuple(t for t in item.get("RepoTags") or () if t != "<none>:<none>"),
                size=int(item.get("Size") or 0),
                created=str(item.get("Created") or ""),
            )
            for item in found
        ]

    def remove_image(self, ref: str) -> None:
        _forget()
        # 409: a container still uses it (it goes with its last container)
        call(
            f"remove image {ref}",
            self.client.api.remove_image,
            ref,
            force=True,
            tolerate=(404, 409),
            retried=True,
        )

    def commit(self, container_id: str, tag: str, labels: dict[str, str]) -> str:
        _forget()
        repository, _, version = tag.rpartition(":")
        result = call(
            f"keep the result of container {container_id[:12]}",
            self.client.api.commit,
            container_id,
            repository=repository or tag,
            tag=version if repository else None,
            conf={"Labels": labels},
            pause=True,
        )
        return str(result["Id"])

    def written_bytes(self, container_id: str) -> int | None:
        try:
            found = call(
                "size a container",
                self.client.api.containers,
                all=True,
                size=True,
                filters={"id": container_id},
            )
        except BridgeError:
            return None  # a watch that cannot read the size this time reads it next time
        size = found[0].get("SizeRw") if found else None
        return int(size) if size is not None else None

    def export_path(self, image: str, path: str, dest: Path) -> None:
        doing = f"read {path} from {image}"
        container = call(
            doing,
            self.client.api.create_container,
            image,
            ["true"],
            network_disabled=True,
            image=image,
        )
        try:
            got = call(doing, self.client.api.get_archive, container["Id"], path, tolerate=(404,))
            if got is None:
                raise SandboxError(f"Image {image} has no {path}; rebuild it.")
            with tarfile.open(fileobj=ChunkReader(got[0]), mode="r|") as archive:
                # Our own image's folder; the filter still keeps every member inside dest.
                archive.extractall(dest, filter="tar")
        finally:
            self.remove(container["Id"])

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
        _forget()
        step = ""
        try:
            stream = self.client.api.build(
                fileobj=io.BytesIO(context),
                custom_context=True,
                tag=tag,
                buildargs=buildargs,
                rm=True,
                forcerm=True,
                decode=True,
                labels=labels,
                dockerfile=dockerfile,
                target=target,
                **({"timeout": int(timeout) + 1} if timeout else {}),
            )
            for item in stream:
                if "error" in item:
                    where = f" at {step[:160]!r}" if step else ""
                    raise BridgeError(f"Building {tag} failed{where}: {item['error'].strip()}")
                text = (item.get("stream") or "").rstrip()
                if text.startswith("Step "):
                    step = text  # "Step 3/5 : RUN ...": named when the build fails there
                if text:
                    on_line(text)
        except docker.errors.APIError as exc:
            raise BridgeError(f"Building {tag} failed: {exc.explanation}") from exc
        except (
            requests.exceptions.ConnectionError,
            requests.exceptions.ReadTimeout,
            urllib3.exceptions.ReadTimeoutError,
        ) as exc:
            silent = not isinstance(exc, requests.exceptions.ConnectionError) or (
                "timed out" in str(exc)
            )
            if timeout and silent:
                raise BridgeError(
                    f"Building {tag} stopped: no output for {timeout:.0f} s at {step[:160]!r}."
                ) from exc
            raise engine_down(exc) from exc
