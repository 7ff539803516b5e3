"""The Docker side: one small wrapper around docker-py (docker is imported only in this package).

Keeping every engine call behind `DockerSandbox` is the seam for other backends (Kubernetes Jobs).
"""

from bridge.sandbox.docker import ContainerSpec, DockerSandbox, ExitInfo, Mount

__all__ = ["ContainerSpec", "DockerSandbox", "ExitInfo", "Mount"]
