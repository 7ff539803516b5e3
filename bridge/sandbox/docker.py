"""How a task container comes up, streams its output, is waited for, killed and removed.

Every container gets the same hardening: no network, all capabilities dropped,
no-new-privileges, read-only root with tmpfs /tmp and home, pid/memory/CPU limits, a non-root
user, and io.worker-bridge.* labels so any process can find (and clean up) it later.
"""

from __future__ import annotations

from collections.abc import Iterator

import docker
import docker.errors
import docker.types
import requests.exceptions

from bridge.errors import EngineUnavailable, ImageMissing, SandboxError
from bridge.sandbox.spec import LABEL, ContainerSpec, ExitInfo, home_id

__all__ = ["LABEL", "ContainerSpec", "DockerSandbox", "ExitInfo", "home_id"]


def _engine_down(exc: Exception) -> EngineUnavailable:
    return EngineUnavailable(
        "Cannot reach the Docker engine; start it (`dockerd &` or `systemctl start docker`) "
        f"or set DOCKER_HOST ({exc.__class__.__name__})."
    )


class DockerSandbox:
    """The only place worker-bridge talks to the container engine."""

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        self._client = client

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = docker.from_env(timeout=120)
                self._client.ping()
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                self._client = None
                raise _engine_down(exc) from exc
        return self._client

    def ping(self) -> str:
        """Engine version, or EngineUnavailable."""
        try:
            return str(self.client.version().get("Version", "?"))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise _engine_down(exc) from exc

    def engine_info(self) -> dict:
        return self.client.info()

    def image_present(self, ref: str) -> bool:
        try:
            self.client.images.get(ref)
            return True
        except docker.errors.ImageNotFound:
            return False
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise _engine_down(exc) from exc

    def require_image(self, ref: str, build_target: str | None) -> None:
        """ImageMissing naming the command that builds ``ref`` (or how to provide it)."""
        if self.image_present(ref):
            return
        if build_target:
            how = f"build it with `worker-bridge images build {build_target}`"
        else:
            how = "build or load it into this engine first (images are never pulled)"
        raise ImageMissing(f"Image {ref} is not present; {how}.")

    # -- containers -------------------------------------------------------------------------

    def start(self, spec: ContainerSpec) -> str:
        """Create and start a hardened container; returns its id. Removes it if start fails."""
        mounts = [
            docker.types.Mount(m.target, str(m.source), type="bind", read_only=m.read_only)
            for m in spec.mounts
        ]
        try:
            container = self.client.containers.create(
                spec.image,
                spec.command,
                user=spec.user,
                working_dir=spec.workdir,
                environment=spec.env,
                labels=spec.labels,
                mounts=mounts,
                network_mode="none",
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                read_only=True,
                tmpfs={path: "rw,nosuid,nodev,mode=1777" for path in spec.tmpfs},
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",
                nano_cpus=int(spec.cpus * 1e9),
                pids_limit=spec.pids,
                runtime=spec.runtime,
                stdin_open=False,
                tty=False,
                detach=True,
            )
        except docker.errors.ImageNotFound as exc:
            raise ImageMissing(f"Image {spec.image} is not present; build it first.") from exc
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"The engine refused to create the container: {exc.explanation}"
            ) from exc
        except requests.exceptions.RequestException as exc:
            raise _engine_down(exc) from exc
        try:
            container.start()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            self.remove(container.id)
            raise SandboxError(f"The container would not start: {exc}") from exc
        return str(container.id)

    def stream_lines(self, container_id: str, since: float | None = None) -> Iterator[str]:
        """Output lines (stdout and stderr) from the start, or from ``since`` (epoch seconds),
        until the container exits."""
        container = self.client.containers.get(container_id)
        pending = b""
        options = {"since": float(since)} if since else {}
        for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True, **options):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode(errors="replace").rstrip("\r")
        if pending:
            yield pending.decode(errors="replace")

    def wait(self, container_id: str, timeout: float | None) -> ExitInfo:
        """Wait for exit; on timeout the container is killed (with everything in it). A
        container removed meanwhile (a cancel) ends with exit_code None."""
        api = self.client.api
        timed_out = False
        try:
            try:
                code = api.wait(container_id, timeout=timeout).get("StatusCode")
            except requests.exceptions.ConnectionError as exc:
                # docker-py surfaces a read timeout as ConnectionError(ReadTimeoutError)
                if "timed out" not in str(exc).lower():
                    raise _engine_down(exc) from exc
                timed_out = True
            except requests.exceptions.ReadTimeout:
                timed_out = True
            if timed_out:
                self.kill(container_id)
                code = api.wait(container_id, timeout=60).get("StatusCode")
            state = api.inspect_container(container_id).get("State", {})
        except docker.errors.NotFound:
            return ExitInfo(exit_code=None, oom_killed=False, timed_out=timed_out)
        return ExitInfo(
            exit_code=code, oom_killed=bool(state.get("OOMKilled")), timed_out=timed_out
        )

    def kill(self, container_id: str) -> None:
        try:
            self.client.containers.get(container_id).kill()
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running any more
                raise SandboxError(f"Could not kill container {container_id[:12]}: {exc}") from exc

    def remove(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # removal already in progress
                raise SandboxError(
                    f"Could not remove container {container_id[:12]}: {exc}"
                ) from exc

    def containers(self, labels: dict[str, str]) -> list[dict]:
        """Containers (any state) carrying all ``labels``: id, status, labels."""
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        try:
            found = self.client.api.containers(all=True, filters=filters)
        except requests.exceptions.ConnectionError as exc:
            raise _engine_down(exc) from exc
        return [{"id": c["Id"], "status": c["State"], "labels": c["Labels"] or {}} for c in found]

    def remove_by_labels(self, labels: dict[str, str]) -> int:
        found = self.containers(labels)
        for item in found:
            self.remove(item["id"])
        return len(found)
