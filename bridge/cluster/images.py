"""An image of the control host's engine put onto a node's engine by id: pushed to the
cluster's registry and pulled on the node by digest, or, with no registry, streamed from one
engine's `save` into the other's `load`. Either way the node's image id must equal the control
host's (the digest of the image's configuration, which both ways carry unchanged); a node that
ends up with another id is refused, never used. The node gets the control host's tags too, so
a task names the image as it does on one machine.

An image with no tag of its own is streamed even when a registry is named: a push needs a
temporary tag, and removing an image's last tag deletes the image from the control host."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from bridge.errors import ImageMismatch, ImageMissing
from bridge.sandbox import distribution
from bridge.sandbox.docker import DockerSandbox

Method = Literal["present", "registry", "stream"]


@dataclass(frozen=True)
class Registry:
    """A registry both engines reach."""

    address: str
    """HOST:PORT as the control host's engine reaches it (it pushes there)."""
    node_address: str | None = None
    """HOST:PORT as the nodes' engines reach it, when that differs (the local cluster's
    registry is on the control host's loopback and at the hub's address for the nodes)."""
    prefix: str = "worker-bridge-cluster"
    """The path under which images are kept in the registry."""

    def repository(self, tag: str, *, for_node: bool = False) -> str:
        """Where an image tagged ``tag`` (worker-bridge/base:0.1.0) is kept."""
        path = distribution.split_reference(tag)[0]
        first, _, rest = path.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            path = rest  # the image's own registry host is not part of the path here
        host = (self.node_address or self.address) if for_node else self.address
        return f"{host}/{self.prefix}/{path}"


@dataclass(frozen=True)
class ImageTransfer:
    """One image put on one node."""

    image_id: str
    node: str
    method: Method
    seconds: float
    digest: str | None = None
    tags: tuple[str, ...] = ()


def put_image(
    host: DockerSandbox,
    node: DockerSandbox,
    image: str,
    *,
    registry: Registry | None = None,
    node_name: str = "the node",
) -> ImageTransfer:
    """Put ``image`` (a reference or an id on the control host's engine ``host``) onto the
    node's engine ``node``, with the control host's tags; raises ImageMismatch when what
    arrives is not the same image, ImageMissing when the control host has no such image."""
    began = time.monotonic()
    source = host.inspect_image(image)
    if source is None:
        raise ImageMissing(f"Image {image} is not present on the control host; build it first.")
    method: Method = "present"
    digest = None
    if node.inspect_image(source.id) is None:
        if registry is not None and source.tags:
            method = "registry"
            digest = distribution.push(host, source.id, registry.repository(source.tags[0]))
            target = registry.repository(source.tags[0], for_node=True)
            arrived = [distribution.pull(node, f"{target}@{digest}")]
        else:
            method = "stream"
            arrived = distribution.load(node, distribution.save(host, source.id))
        if source.id not in arrived:
            raise ImageMismatch(
                f"Image {image} reached {node_name} as {', '.join(arrived) or 'nothing'}, not as"
                f" the control host's {source.id}: refused.",
                image=image,
                node=node_name,
                found=arrived,
            )
    for name in source.tags:
        distribution.tag(node, source.id, name)
    for name in source.tags or (source.id,):
        check_image(node, name, source.id, node_name=node_name)
    seconds = round(time.monotonic() - began, 3)
    return ImageTransfer(source.id, node_name, method, seconds, digest, tuple(source.tags))


def check_image(
    node: DockerSandbox, reference: str, expected_id: str, *, node_name: str = "the node"
) -> None:
    """The node's image named ``reference`` is the control host's ``expected_id``, or
    ImageMismatch says what it is instead."""
    found = node.inspect_image(reference)
    if found is None or found.id != expected_id:
        what = f"image {found.id}" if found else "no such image"
        raise ImageMismatch(
            f"{node_name} has {what} as {reference}, not the control host's {expected_id}:"
            " refused.",
            image=reference,
            node=node_name,
            found=found.id if found else None,
        )


_published: dict[tuple[str, str], str] = {}


def publish(host: DockerSandbox, reference: str, image_id: str, registry: Registry) -> str:
    """Where a node's engine pulls the control host's ``image_id`` (tagged ``reference``) by
    digest: pushed to ``registry`` once per image id and registry in this process."""
    key = (image_id, registry.address)
    digest = _published.get(key)
    if digest is None:
        digest = _published[key] = distribution.push(host, image_id, registry.repository(reference))
    return f"{registry.repository(reference, for_node=True)}@{digest}"
