"""An engine's images leaving it and arriving at another engine, byte for byte (docker-py stays
in this package): `save` streams an image, named by its id, as the engine's archive, and `load`
reads one in; `push` sends an image to a registry under a reference of its own and gives the
manifest's digest, `pull` fetches one by digest; `tag` names an image. The image id (the
digest of the image's configuration) survives each way: bridge/cluster/images.py checks it.

`push` needs the image to have a tag of its own besides the temporary one it pushes under:
removing an image's last tag deletes the image, and the source engine's images must be left as
they were."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator
from typing import Any

import docker
import docker.errors
import requests.exceptions
import urllib3.exceptions

from bridge.errors import SandboxError
from bridge.sandbox.docker import DockerSandbox
from bridge.sandbox.engine import call, engine_down

_CHUNK = 1024 * 1024
_STREAM_ERRORS = (
    docker.errors.DockerException,
    requests.exceptions.RequestException,
    urllib3.exceptions.HTTPError,
)


def engine_at(base_url: str) -> DockerSandbox:
    """A `DockerSandbox` on the engine at ``base_url`` (unix:///path/docker.sock, tcp://...)."""
    try:
        client = docker.DockerClient(base_url=base_url, timeout=120)
        client.version()
    except _STREAM_ERRORS as exc:
        raise engine_down(exc) from exc
    if client.api.base_url.startswith("http+docker://"):
        client.api.trust_env = False  # a local socket: no proxy of the environment applies
    return DockerSandbox(client)


def split_reference(reference: str) -> tuple[str, str]:
    """`host:5000/a/b:tag` -> (`host:5000/a/b`, `tag`); no tag -> `latest`."""
    repository, _, tag = reference.rpartition(":")
    if not repository or "/" in tag:
        return reference, "latest"
    return repository, tag


def _messages(doing: str, answers: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The engine's progress messages of a load, push or pull; its error as ours."""
    try:
        for answer in answers:
            if answer.get("error") or answer.get("errorDetail"):
                detail = answer.get("errorDetail") or {}
                raise SandboxError(f"Could not {doing}: {answer.get('error') or detail}")
            yield answer
    except _STREAM_ERRORS as exc:
        raise SandboxError(f"Could not {doing}: {exc.__class__.__name__}: {exc}") from exc


def save(sandbox: DockerSandbox, image_id: str) -> Iterator[bytes]:
    """The engine's archive of one image (by id: its manifest then names no tag), streamed."""
    doing = f"save image {image_id[:19]}"
    chunks = call(doing, sandbox.client.api.get_image, image_id, chunk_size=_CHUNK)
    try:
        yield from chunks
    except _STREAM_ERRORS as exc:
        raise SandboxError(f"Could not {doing}: {exc.__class__.__name__}: {exc}") from exc


def load(sandbox: DockerSandbox, chunks: Iterable[bytes]) -> list[str]:
    """Read an archive into the engine; the ids of the images it held."""
    doing = "load an image archive"
    answers = call(doing, sandbox.client.api.load_image, chunks)
    loaded = []
    for answer in _messages(doing, answers):
        text = str(answer.get("stream") or "")
        if text.startswith("Loaded image ID: "):
            loaded.append(text.removeprefix("Loaded image ID: ").strip())
    return loaded


def push(sandbox: DockerSandbox, image_id: str, repository: str) -> str:
    """Push the image under ``repository`` (a registry's HOST:PORT/path) and a temporary tag,
    removed again afterwards; the manifest's digest (sha256:...)."""
    info = sandbox.inspect_image(image_id)
    if info is None:
        raise SandboxError(f"Could not push image {image_id[:19]}: the engine has no such image.")
    if not info.tags:
        raise SandboxError(
            f"Could not push image {image_id[:19]}: it has no tag, and removing the temporary"
            " tag a push needs would delete it; stream it instead."
        )
    tag = f"wb-{secrets.token_hex(6)}"
    doing = f"push image {image_id[:19]} to {repository}"
    call(doing, sandbox.client.api.tag, image_id, repository, tag)
    digest = ""
    try:
        answers = call(doing, sandbox.client.api.push, repository, tag, stream=True, decode=True)
        for answer in _messages(doing, answers):
            digest = str((answer.get("aux") or {}).get("Digest") or digest)
    finally:
        # The tag only: the image keeps the tags it had (checked above).
        call(
            f"untag {repository}:{tag}",
            sandbox.client.api.remove_image,
            f"{repository}:{tag}",
            noprune=True,
            tolerate=(404,),
        )
    if not digest.startswith("sha256:"):
        raise SandboxError(f"Could not {doing}: the registry gave no digest.")
    return digest


def pull(sandbox: DockerSandbox, reference: str) -> str:
    """Pull ``reference`` (REPOSITORY@sha256:...); the id of the image it names."""
    doing = f"pull {reference}"
    for _ in _messages(
        doing, call(doing, sandbox.client.api.pull, reference, stream=True, decode=True)
    ):
        pass
    info = sandbox.inspect_image(reference)
    if info is None:
        raise SandboxError(f"Could not {doing}: the engine has no image by that name after it.")
    return info.id


def tag(sandbox: DockerSandbox, image_id: str, reference: str) -> None:
    """Name the image ``reference`` (moving the name off another image that had it)."""
    repository, version = split_reference(reference)
    call(
        f"tag {image_id[:19]} as {reference}",
        sandbox.client.api.tag,
        image_id,
        repository,
        version,
        force=True,
    )
