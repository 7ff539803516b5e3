"""`DockerSandbox`: the `Sandbox` protocol on a local Docker engine (docker-py is imported only in
this package).

Every container gets the same hardening: no network, all capabilities dropped,
no-new-privileges, read-only root with size-bounded tmpfs /tmp and home, pid/memory/CPU limits,
a bounded engine log, a non-root user, and io.worker-bridge.* labels so any process can find
(and clean up) it later. Idempotent engine calls are retried on a transient failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import docker
import docker.errors
import docker.types
import requests.exceptions
import urllib3.exceptions
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from bridge.errors import BridgeError, EngineUnavailable, ImageMissing, SandboxError
from bridge.sandbox.output import ChunkReader
from bridge.sandbox.spec import ContainerInfo, ContainerSpec, ContainerState, ExitInfo, ImageInfo

_STATES: dict[str, ContainerState] = {
    "created": "created",
    "running": "running",
    "paused": "running",
    "restarting": "running",
    "removing": "removing",
    "exited": "exited",
    "dead": "exited",
}


def _engine_down(exc: Exception) -> EngineUnavailable:
    return EngineUnavailable(
        "Cannot reach the Docker engine; start it (`dockerd &` or `systemctl start docker`) "
        f"or set DOCKER_HOST ({exc.__class__.__name__})."
    )


def _transient(exc: BaseException) -> bool:
    """An engine hiccup worth one more try: a dropped connection or a 5xx answer."""
    if isinstance(exc, requests.exceptions.ConnectionError):
        return "timed out" not in str(exc).lower()
    return isinstance(exc, docker.errors.APIError) and exc.is_server_error()


_retry = retry(
    retry=retry_if_exception(_transient),
    stop=stop_after_attempt(3),
    wait=wait_exponential(multiplier=0.1, max=1.0),
    reraise=True,
)


def _seconds(start: str | None, end: str | None) -> float | None:
    """The engine's start and finish timestamps (RFC 3339, nanoseconds) as a duration."""
    if not start or not end or start.startswith("0001") or end.startswith("0001"):
        return None

    def parse(text: str) -> datetime:
        head, _, frac = text.rstrip("Z").partition(".")
        return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00")

    return round(max((parse(end) - parse(start)).total_seconds(), 0.0), 3)


def _image_info(attrs: dict) -> ImageInfo:
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
        try:
            return str(self.client.version().get("Version", "?"))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise _engine_down(exc) from exc

    def runtimes(self) -> dict[str, list[str]]:
        found = self.client.info().get("Runtimes") or {}
        return {name: list((spec or {}).get("runtimeArgs") or []) for name, spec in found.items()}

    def image_present(self, ref: str) -> bool:
        try:
            _retry(self.client.images.get)(ref)
            return True
        except docker.errors.ImageNotFound:
            return False
        except requests.exceptions.RequestException as exc:
            raise _engine_down(exc) from exc

    def image_labels(self, ref: str) -> dict[str, str] | None:
        try:
            image = _retry(self.client.images.get)(ref)
        except docker.errors.ImageNotFound:
            return None
        except requests.exceptions.RequestException as exc:
            raise _engine_down(exc) from exc
        return dict((image.attrs.get("Config") or {}).get("Labels") or {})

    def inspect_image(self, ref: str) -> ImageInfo | None:
        try:
            attrs = _retry(self.client.api.inspect_image)(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            if exc.status_code == 404:
                return None
            raise SandboxError(f"Could not inspect image {ref}: {exc.explanation}") from exc
        except requests.exceptions.RequestException as exc:
            raise _engine_down(exc) from exc
        return _image_info(attrs)

    def images(self, labels: dict[str, str]) -> list[ImageInfo]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        try:
            found = _retry(self.client.api.images)(filters=filters)
        except requests.exceptions.RequestException as exc:
            raise _engine_down(exc) from exc
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
        try:
            _retry(self.client.api.remove_image)(ref, force=True)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code not in (404, 409):  # 409: a container still uses it
                raise SandboxError(f"Could not remove image {ref}: {exc.explanation}") from exc
        except requests.exceptions.RequestException as exc:
            raise _engine_down(exc) from exc

    def commit(self, container_id: str, tag: str, labels: dict[str, str]) -> str:
        repository, _, version = tag.rpartition(":")
        try:
            result = self.client.api.commit(
                container_id,
                repository=repository or tag,
                tag=version if repository else None,
                conf={"Labels": labels},
                pause=True,
            )
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"Could not keep the result of container {container_id[:12]}: {exc.explanation}"
            ) from exc
        except requests.exceptions.RequestException as exc:
            raise _engine_down(exc) from exc
        return str(result["Id"])

    def written_bytes(self, container_id: str) -> int | None:
        try:
            found = self.client.api.containers(all=True, size=True, filters={"id": container_id})
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return None
        size = found[0].get("SizeRw") if found else None
        return int(size) if size is not None else None

    def export_path(self, image: str, path: str, dest: Path) -> None:
        import tarfile

        try:
            container = self.client.api.create_container(image, ["true"], network_disabled=True)
        except docker.errors.ImageNotFound as exc:
            raise ImageMissing(f"Image {image} is not present; build it first.") from exc
        except docker.errors.APIError as exc:
            raise SandboxError(f"Could not read {path} from {image}: {exc.explanation}") from exc
        except requests.exceptions.RequestException as exc:
            raise _engine_down(exc) from exc
        try:
            stream, _ = self.client.api.get_archive(container["Id"], path)
            reader = ChunkReader(stream)
            with tarfile.open(fileobj=reader, mode="r|") as archive:
                # Our own image's folder; the filter still keeps every member inside dest.
                archive.extractall(dest, filter="tar")
        except docker.errors.NotFound as exc:
            raise SandboxError(f"Image {image} has no {path}; rebuild it.") from exc
        except docker.errors.APIError as exc:
            raise SandboxError(f"Could not read {path} from {image}: {exc.explanation}") from exc
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
        import io

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
            raise _engine_down(exc) from exc

    # -- containers -------------------------------------------------------------------------

    def start(self, spec: ContainerSpec) -> str:
        mounts = [
            docker.types.Mount(m.target, str(m.source), type="bind", read_only=m.read_only)
            for m in spec.mounts
        ]
        tmpfs_size = f"size={spec.memory_mb}m"
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
                read_only=spec.read_only_root,
                **({} if spec.entrypoint is None else {"entrypoint": spec.entrypoint or [""]}),
                tmpfs={path: f"rw,nosuid,nodev,mode=1777,{tmpfs_size}" for path in spec.tmpfs},
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",
                nano_cpus=int(spec.cpus * 1e9),
                pids_limit=spec.pids,
                runtime=spec.runtime,
                log_config=docker.types.LogConfig(
                    type="json-file",
                    config={"max-size": f"{max(spec.log_max_mb // 2, 1)}m", "max-file": "2"},
                ),
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

    def output(
        self,
        container_id: str,
        *,
        since: float | None = None,
        stdout: bool = True,
        stderr: bool = True,
        tail: int | None = None,
    ) -> Iterator[bytes]:
        options: dict = {"since": float(since)} if since else {}
        try:
            if tail is not None:  # the engine splits long lines into 16 KiB entries: bounded
                yield self.client.api.logs(
                    container_id, stream=False, stdout=stdout, stderr=stderr, tail=tail
                )
                return
            stream = self.client.api.logs(
                container_id, stream=True, follow=True, stdout=stdout, stderr=stderr, **options
            )
        except docker.errors.NotFound:
            return
        yield from stream

    def wait(self, container_id: str, timeout: float | None) -> ExitInfo:
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
            state = self._inspect_state(container_id)
        except docker.errors.NotFound:
            return ExitInfo(exit_code=None, oom_killed=False, timed_out=timed_out)
        return ExitInfo(
            exit_code=code,
            oom_killed=bool(state.get("OOMKilled")),
            timed_out=timed_out,
            duration_s=_seconds(state.get("StartedAt"), state.get("FinishedAt")),
        )

    @_retry
    def _inspect_state(self, container_id: str) -> dict:
        return self.client.api.inspect_container(container_id).get("State", {})

    def kill(self, container_id: str) -> None:
        try:
            self.client.api.kill(container_id)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running any more
                raise SandboxError(f"Could not kill container {container_id[:12]}: {exc}") from exc

    def remove(self, container_id: str) -> None:
        try:
            _retry(self.client.api.remove_container)(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise SandboxError(
                    f"Could not remove container {container_id[:12]}: {exc}"
                ) from exc
        except requests.exceptions.ConnectionError as exc:
            raise _engine_down(exc) from exc

    def containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        try:
            found = _retry(self.client.api.containers)(all=True, filters=filters)
        except requests.exceptions.ConnectionError as exc:
            raise _engine_down(exc) from exc
        return [
            ContainerInfo(c["Id"], _STATES.get(c["State"], "exited"), c["Labels"] or {})
            for c in found
        ]

    def remove_by_labels(self, labels: dict[str, str]) -> int:
        found = self.containers(labels)
        for item in found:
            self.remove(item.id)
        return len(found)
