"""The one place the container engine's errors become ours (docker-py and requests are
imported only in this package): `call` makes one engine call, retried when idempotent and the
failure transient, with its errors translated; `engine_down` says how to reach the engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import docker
import docker.errors
import requests.exceptions
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from bridge.errors import EngineUnavailable, ImageMissing, SandboxError


def engine_down(exc: Exception) -> EngineUnavailable:
    return EngineUnavailable(
        "Cannot reach the Docker engine; start it (`dockerd &` or `systemctl start docker`) "
        f"or set DOCKER_HOST ({exc.__class__.__name__})."
    )


def _transient(exc: BaseException) -> bool:
    """An engine hiccup worth one more try: a dropped connection or a 5xx answer."""
    if isinstance(exc, requests.exceptions.ConnectionError):
        return "timed out" not in str(exc).lower()
    return isinstance(exc, docker.errors.APIError) and exc.is_server_error()


retry_idempotent = retry(
    retry=retry_if_exception(_transient),
    stop=stop_after_attempt(3),
    wait=wait_exponential(multiplier=0.1, max=1.0),
    reraise=True,
)


def call(
    doing: str,
    fn: Callable[..., Any],
    *args: Any,
    image: str | None = None,
    tolerate: tuple[int, ...] = (),
    retried: bool = False,
    **kwargs: Any,
) -> Any:
    """One engine call, its errors in our words (the one place they are translated): the engine
    unreachable (EngineUnavailable); the image ``image`` missing (ImageMissing); an answer whose
    status is in ``tolerate`` (404: it is gone, 409: it is already so) is None; anything else
    the engine refuses is SandboxError("Could not <doing>: <why>"). ``retried``: an idempotent
    call, tried again after a transient failure."""
    try:
        return (retry_idempotent(fn) if retried else fn)(*args, **kwargs)
    except docker.errors.ImageNotFound as exc:
        if image is not None:
            raise ImageMissing(f"Image {image} is not present; build it first.") from exc
        if 404 in tolerate:
            return None
        raise SandboxError(f"Could not {doing}: {exc.explanation}") from exc
    except docker.errors.APIError as exc:
        if exc.status_code in tolerate:
            return None
        raise SandboxError(f"Could not {doing}: {exc.explanation}") from exc
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise engine_down(exc) from exc
