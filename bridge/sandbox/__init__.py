"""Containers: the `Sandbox` protocol the pipeline uses, what a container is (`ContainerSpec`),
and its implementations, `DockerSandbox` (docker.py and engine.py, the only modules
importing docker-py) and `FakeSandbox` (no engine, for tests). Both load on first use,
so commands that never start a container stay quick to load."""

from typing import Any

from bridge.sandbox.protocol import Sandbox, require_image
from bridge.sandbox.spec import (
    LABEL,
    ContainerInfo,
    ContainerSpec,
    ExitInfo,
    ImageInfo,
    Mount,
    home_id,
)

__all__ = [
    "LABEL",
    "ContainerInfo",
    "ContainerSpec",
    "DockerSandbox",
    "ExitInfo",
    "FakeSandbox",
    "ImageInfo",
    "Mount",
    "Sandbox",
    "home_id",
    "require_image",
]


def __getattr__(name: str) -> Any:
    if name == "DockerSandbox":
        from bridge.sandbox.docker import DockerSandbox

        return DockerSandbox
    if name == "FakeSandbox":
        from bridge.sandbox.fake import FakeSandbox

        return FakeSandbox
    raise AttributeError(name)
