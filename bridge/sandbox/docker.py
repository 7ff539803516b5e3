"""`DockerSandbox`: the `Sandbox` protocol on a local Docker engine, its containers and its
images (docker-py is imported only in this package; the engine's errors become ours in
engine.py).

Every container gets the same hardening: no network (a namespace of its own holding only
`lo`), all capabilities dropped, no-new-privileges, read-only root with size-bounded tmpfs /tmp
and home, pid/memory/CPU limits, a bounded engine log, a non-root user, and io.worker-bridge.*
labels so any process can find (and clean up) it later. Idempotent engine calls are retried on
a transient failure.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import IO, Any, cast

import docker
import docker.errors
import docker.types
import requests.exceptions
import urllib3.exceptions

from bridge.errors import BridgeError, SandboxError
from bridge.sandbox.engine import call, engine_down, retry_idempotent
from bridge.sandbox.output import ChunkReader
from bridge.sandbox.spec import ContainerInfo, ContainerSpec, ContainerState, ExitInfo, ImageInfo

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


_SIGKILLED = 137  # 128 + SIGKILL: the OOM killer's, or anyone's kill -9
_OOM_EVENT_S = 0.5  # how long a SIGKILLed container's OOM event may follow its exit

_STATES: dict[str, ContainerState] = {
    "created": "created",
    "running": "running",
    "paused": "running",
    "restarting": "running",
    "removing": "removing",
    "exited": "exited",
    "dead": "exited",
}


def _parse(text: str) -> datetime:
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00")


def _seconds(start: str | None, end: str | None) -> float | None:
    """The engine's start and finish timestamps (RFC 3339, nanoseconds) as a duration."""
    if not start or not end or start.startswith("0001") or end.startswith("0001"):
        return None
    return round(max((_parse(end) - _parse(start)).total_seconds(), 0.0), 3)


def _epoch(at: str | None) -> float | None:
    return None if not at or at.startswith("0001") else _parse(at).timestamp()


class DockerSandbox:
    """The only place worker-bridge talks to the container engine."""

    supports_pool = True  # its containers may be pooled (bridge/sandbox/pool.py)

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        self._client = client

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:  # from_env asks the engine its API version: that call proves it reachable
                client = docker.from_env(timeout=120)
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                raise engine_down(exc) from exc
            if client.api.base_url.startswith("http+docker://"):
                # A local socket: no proxy or .netrc of the environment applies to it, and
                # requests would read the whole environment again for each call to learn so.
                client.api.trust_env = False
            self._client = client
        return self._client

    def ping(self) -> str:
        version = call("ask the engine its version", lambda: self.client.version())
        return str(version.get("Version", "?"))

    def runtimes(self) -> dict[str, list[str]]:
        found = call("read the engine's runtimes", lambda: self.client.info()).get("Runtimes")
        return {
            name: list((spec or {}).get("runtimeArgs") or [])
            for name, spec in (found or {}).items()
        }

    def _inspect(self, container_id: str) -> dict[str, Any] | None:
        """The engine's inspect of a container (None: it knows no such container)."""
        return call(
            f"inspect container {container_id[:12]}",
            self.client.api.inspect_container,
            container_id,
            tolerate=(404,),
            retried=True,
        )

    def container_mounts(self, container_id: str) -> list[dict[str, Any]] | None:
        """The `Mounts` of a container (None: the engine knows no such container)."""
        attrs = self._inspect(container_id)
        return None if attrs is None else list(attrs.get("Mounts") or [])

    def container_pid(self, container_id: str) -> int | None:
        """The host pid of a running container's first process (None: not running, or gone)."""
        attrs = self._inspect(container_id)
        return int(((attrs or {}).get("State") or {}).get("Pid") or 0) or None

    # -- containers -------------------------------------------------------------------------

    def start(self, spec: ContainerSpec) -> str:
        mounts = [
            docker.types.Mount(
                m.target,
                str(m.source),
                type="bind",
                read_only=m.read_only,
                propagation=m.propagation or None,
            )
            for m in spec.mounts
        ]
        tmpfs_size = f"size={spec.memory_mb}m"
        # No entrypoint given: the image's own ([""] clears it); docker-py sends none for None.
        entrypoint: dict[str, Any] = {}
        if spec.entrypoint is not None:
            entrypoint["entrypoint"] = spec.entrypoint or [""]
        container = call(
            "create the container",
            self.client.containers.create,
            spec.image,
            spec.command,
            user=spec.user,
            working_dir=spec.workdir,
            environment=spec.env,
            labels=spec.labels,
            mounts=mounts,
            # A fresh network namespace holding only `lo` (runc brings it up), with no
            # libnetwork sandbox: with `none` alone the engine still made one and ran its
            # set-up hook, a second start of its whole binary, ~0.1 s of CPU per container
            # (docs/benchmarks.md, "The engine's network hook").
            network_mode="none",
            network_disabled=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=spec.read_only_root,
            **entrypoint,
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
            image=spec.image,
        )
        try:
            call("start the container", container.start)
        except BridgeError:
            self.remove(container.id)
            raise
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
        if tail is not None:  # the engine splits long lines into 16 KiB entries: bounded
            options = {"stream": False, "tail": tail}
        else:
            options.update(stream=True, follow=True)
        found = call(
            f"read the output of container {container_id[:12]}",
            self.client.api.logs,
            container_id,
            stdout=stdout,
            stderr=stderr,
            tolerate=(404,),
            **options,
        )
        if found is None:
            return
        if tail is not None:
            yield found
            return
        yield from found

    def wait(self, container_id: str, timeout: float | None) -> ExitInfo:
        api = self.client.api
        timed_out = False
        try:
            try:
                # docker-py hands the timeout to requests, which takes seconds as a float;
                # its stub says int.
                code = api.wait(container_id, timeout=timeout).get("StatusCode")  # type: ignore[arg-type]
            except requests.exceptions.ConnectionError as exc:
                # docker-py surfaces a read timeout as ConnectionError(ReadTimeoutError)
                if "timed out" not in str(exc).lower():
                    raise engine_down(exc) from exc
                timed_out = True
            except requests.exceptions.ReadTimeout:
                timed_out = True
            if timed_out:
                self.kill(container_id)
                code = api.wait(container_id, timeout=60).get("StatusCode")
            state = self._inspect_state(container_id)
            if code == _SIGKILLED and not timed_out and not state.get("OOMKilled"):
                state = self._oom_state(container_id, state)
        except docker.errors.NotFound:
            return ExitInfo(exit_code=None, oom_killed=False, timed_out=timed_out)
        return ExitInfo(
            exit_code=code,
            oom_killed=bool(state.get("OOMKilled")),
            timed_out=timed_out,
            duration_s=_seconds(state.get("StartedAt"), state.get("FinishedAt")),
            finished_at=_epoch(state.get("FinishedAt")),
        )

    def _oom_state(self, container_id: str, state: dict) -> dict:
        """The state of a container killed by SIGKILL that no one here killed, once the engine
        has taken the kernel's OOM event in: under cgroup v1 it can handle the exit first, and
        an inspect right after it says OOMKilled false (seen 1 run in 3 of the suite under
        load). Asked again for up to half a second; a kill that was not the OOM killer's stays."""
        deadline = time.monotonic() + _OOM_EVENT_S
        while not state.get("OOMKilled") and time.monotonic() < deadline:
            time.sleep(0.05)
            state = self._inspect_state(container_id)
        return state

    @retry_idempotent
    def _inspect_state(self, container_id: str) -> dict:
        return self.client.api.inspect_container(container_id).get("State", {})

    def kill(self, container_id: str) -> None:
        # 409: not running any more
        call(
            f"kill container {container_id[:12]}",
            self.client.api.kill,
            container_id,
            tolerate=(404, 409),
        )

    def remove(self, container_id: str) -> None:
        # 409: its removal is already under way
        call(
            f"remove container {container_id[:12]}",
            self.client.api.remove_container,
            container_id,
            force=True,
            v=True,
            tolerate=(404, 409),
            retried=True,
        )

    def containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        found = call(
            "list containers", self.client.api.containers, all=True, filters=filters, retried=True
        )
        return [
            ContainerInfo(c["Id"], _STATES.get(c["State"], "exited"), c["Labels"] or {})
            for c in found
        ]

    def remove_by_labels(self, labels: dict[str, str]) -> int:
        found = self.containers(labels)
        for item in found:
            self.remove(item.id)
        return len(found)

    # -- images -----------------------------------------------------------------------------

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
            # A stream ("r|"): the archive is only ever read, front to back.
            stream = cast(IO[bytes], ChunkReader(got[0]))
            with tarfile.open(fileobj=stream, mode="r|") as archive:
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
        # Without a timeout of the build's own the client's applies (an explicit None would
        # mean none at all).
        limit: dict[str, Any] = {"timeout": int(timeout) + 1} if timeout else {}
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
                **limit,
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
