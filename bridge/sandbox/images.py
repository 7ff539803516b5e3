"""Build the worker-bridge images from images/<name>/Dockerfile with docker-py.

The image contexts are package data (bridge/images, which the repository's top-level `images`
links to), so an installed wheel builds them too.

`base` builds FROM the configured base image (a build argument, so it works with a local
debootstrap import where no registry is reachable); every other image builds FROM `base`.
Builds go through the `Sandbox` protocol, so this module knows no engine.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

from bridge.config.settings import Config
from bridge.errors import BridgeError, InvalidSpec
from bridge.sandbox.protocol import Sandbox
from bridge.version import __version__

SOURCE_URL = "https://github.com/worker-bridge/worker-bridge"  # the OCI source label
DEFAULT_TARGETS = ("base", "verify", "mock")
_KEPT_LINES = 40  # of the failing step's output, to find the registry's own error in
# What a registry's failure looks like in a step's output, and what to do about it.
_TLS = (
    "SELF_SIGNED_CERT_IN_CHAIN",
    "UNABLE_TO_GET_ISSUER_CERT",
    "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
    "CERT_UNTRUSTED",
    "CERTIFICATE_VERIFY_FAILED",
    "certificate verify failed",
    "self-signed certificate",
)
_UNREACHABLE = (
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNREFUSED",
    "ECONNRESET",
    "ETIMEDOUT",
    "Could not resolve",
    "Temporary failure resolving",
    "Failed to fetch",
    "Network is unreachable",
)


def images_dir() -> Path:
    """The image contexts: WORKER_BRIDGE_IMAGES_DIR, else the package's own (bridge/images)."""
    override = os.environ.get("WORKER_BRIDGE_IMAGES_DIR")
    return Path(override) if override else Path(__file__).resolve().parents[1] / "images"


def available_targets() -> list[str]:
    root = images_dir()
    return sorted(p.name for p in root.iterdir() if (p / "Dockerfile").is_file())


def _context(name: str, extra_ca: Path | None) -> bytes:
    """The build context as a tar: the image's folder, plus extra-ca.pem for `base`."""
    folder = images_dir() / name
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            if path.name == "extra-ca.pem":
                continue
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
        if name == "base":
            data = extra_ca.read_bytes() if extra_ca else b""
            info = tarfile.TarInfo("extra-ca.pem")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build_images(
    config: Config,
    sandbox: Sandbox,
    targets: list[str] | None = None,
    base_image: str | None = None,
    on_line: Callable[[str], None] = print,
) -> list[str]:
    """Build ``targets`` (default base, verify, mock) in dependency order; returns the tags."""
    known = available_targets()
    wanted = list(targets or DEFAULT_TARGETS)
    for name in wanted:
        if name not in known:
            raise InvalidSpec(f"No image named '{name}'; choose from: {', '.join(known)}.")
    base_ref = config.image_for("base")
    if "base" not in wanted and not sandbox.image_present(base_ref):
        wanted.insert(0, "base")
    ordered = (["base"] if "base" in wanted else []) + [n for n in wanted if n != "base"]
    if config.extra_ca_file and not config.extra_ca_file.is_file():
        raise BridgeError(f"extra_ca_file {config.extra_ca_file} does not exist; fix the config.")
    built = []
    for name in ordered:
        tag = config.image_for(name)
        parent = (base_image or config.base_image) if name == "base" else base_ref
        on_line(f"==> building {tag} (FROM {parent})")
        step: list[str] = []

        def seen(text: str, step: list[str] = step) -> None:
            for line in text.splitlines():  # an engine's message may hold several
                if line.startswith("Step "):
                    step.clear()
                step.append(line)
            del step[:-_KEPT_LINES]
            on_line(text)

        try:
            sandbox.build_image(
                tag,
                _context(name, config.extra_ca_file),
                buildargs={"BASE_IMAGE": parent},
                labels={
                    "io.worker-bridge.image": name,
                    "org.opencontainers.image.title": f"worker-bridge {name}",
                    "org.opencontainers.image.version": __version__,
                    "org.opencontainers.image.source": SOURCE_URL,
                },
                on_line=seen,
            )
        except BridgeError as exc:
            raise BridgeError(explain_build_failure(exc.message, step, config)) from exc
        built.append(tag)
    return built


def explain_build_failure(message: str, step_output: list[str], config: Config) -> str:
    """The engine's account of a failed build (it names the step), with the registry's own
    error from the step's output and what to do about it, when there is one."""
    message = " ".join(message.split())  # one line, whatever the engine's text held
    cause = next((line.strip() for line in reversed(step_output) if _registry_error(line)), None)
    if cause is None:
        return message
    said = f"{message.rstrip('.')}; the step said: {cause[:300]}"
    if any(mark in cause for mark in _TLS):
        has = f" (now {config.extra_ca_file})" if config.extra_ca_file else ""
        return (
            f"{said}. The registry's TLS certificate is not trusted inside the build (a network "
            "that intercepts TLS): set extra_ca_file in config.yaml or WORKER_BRIDGE_EXTRA_CA_FILE "
            f"to that network's CA bundle{has}, then build again."
        )
    return (
        f"{said}. The registry could not be reached from the build (the step was retried with "
        "backoff); check the engine's network, or build again later."
    )


def _registry_error(line: str) -> bool:
    if line.startswith("wb-retry:"):  # its own note quotes the command, not the registry
        return False
    return any(mark in line for mark in (*_TLS, *_UNREACHABLE))
