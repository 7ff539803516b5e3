"""The Docker side: one small wrapper around docker-py (docker is imported only in this package).

Keeping every engine call behind `DockerSandbox` is the seam for other backends (Kubernetes Jobs).
`DockerSandbox` is loaded on first use, so commands that never touch the engine start quickly.
"""

from typing import Any

from bridge.sandbox.spec import LABEL, ContainerSpec, ExitInfo, Mount, home_id

__all__ = ["LABEL", "ContainerSpec", "DockerSandbox", "ExitInfo", "Mount", "home_id"]


def __getattr__(name: str) -> Any:
    if name == "DockerSandbox":
        from bridge.sandbox.docker import DockerSandbox

        return DockerSandbox
    raise AttributeError(name)
