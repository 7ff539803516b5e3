"""The worker's CLI inside a project's own image. Every worker image carries a self-contained
bundle at /opt/worker-bridge (the CLI's native binary, the gateway relay, and socat with its own
libraries and loader, so the relay needs nothing of the image it runs in). It is copied out of
the worker image once per image id, to `<home>/bundles/<id>/`, and mounted read-only at the same
path into the project's image, first on PATH. No image is built per project: what a task adds
to an environment is one read-only mount.

Before a worker runs in an image, a probe (`Worker.probe`, e.g. `claude --version`) shows the
CLI runs there; its answer is kept per (environment image, bundle), so each pair is probed once.
An image without /bin/sh or without a glibc loader is refused, saying which."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bridge.errors import EnvironmentFailed
from bridge.phase.handle import PhaseHandle
from bridge.phase.run_container import Reader, run_container
from bridge.phase.specs import task_container
from bridge.sandbox import Mount
from bridge.sandbox.output import Tail
from bridge.workers import Worker
from bridge.workspace.fs import remove_tree

BUNDLE = "/opt/worker-bridge"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NO_GLIBC = 97  # the probe's exit status when the image has no glibc loader
# Runs the probe only where a glibc dynamic loader exists (the CLIs are linked against glibc).
PROBE_SCRIPT = (
    "for f in /lib64/ld-linux-*.so.* /lib/ld-linux-*.so.* /lib/*/ld-linux-*.so.*; do "
    '[ -e "$f" ] && exec "$@"; done; '
    f'echo "no glibc dynamic loader (ld-linux) in this image" >&2; exit {NO_GLIBC}'
)


def worker_bundle(handle: PhaseHandle, worker_image: str) -> Path:
    """The host folder holding ``worker_image``'s bundle (copied out on first use)."""
    sandbox, home = handle.ctx.sandbox, handle.ctx.home
    info = sandbox.known_image(worker_image)  # the preflight looked it up a moment ago
    if info is None:
        raise EnvironmentFailed(
            f"Image {worker_image} is not present; build it with `worker-bridge images build`."
        )
    folder = home / "bundles" / info.id.removeprefix("sha256:")[:24]
    if (folder / "bundle" / "bin").is_dir():
        return folder / "bundle"
    partial = folder.with_name(f".partial-{folder.name}-{os.getpid()}-{os.urandom(3).hex()}")
    try:
        partial.mkdir(parents=True)
        sandbox.export_path(worker_image, BUNDLE, partial)
        exported = partial / Path(BUNDLE).name
        if not (exported / "bin").is_dir():
            raise EnvironmentFailed(
                f"Image {worker_image} has no bundle at {BUNDLE}/bin; rebuild it with "
                "`worker-bridge images build`."
            )
        os.rename(exported, partial / "bundle")
        try:
            os.rename(partial, folder)
        except OSError:
            pass  # another runner made it first: theirs is the same
    finally:
        remove_tree(partial)
    return folder / "bundle"


def image_path(env: dict[str, str]) -> str:
    """PATH inside a container from an image with environment ``env``, the bundle first."""
    return f"{BUNDLE}/bin:{env.get('PATH') or DEFAULT_PATH}"


def check_worker_runs(
    handle: PhaseHandle,
    worker: Worker,
    image: str,
    image_id: str,
    image_env: dict[str, str],
    bundle: Path,
) -> None:
    """EnvironmentFailed unless ``worker``'s CLI runs in ``image`` (asked once per pair)."""
    if worker.probe is None:
        raise EnvironmentFailed(
            f"The {worker.name} worker cannot run inside a project environment; drop "
            "`environment` or choose a built-in worker."
        )
    answers = bundle.parent / "probes"
    answer = answers / f"{image_id.removeprefix('sha256:')[:24]}.json"
    try:
        known = json.loads(answer.read_text())
        if known.get("probe") == list(worker.probe):
            return
    except (OSError, ValueError):
        pass
    ctx = handle.ctx
    user, _ = ctx.sandbox_identity()
    tail = Tail(4096)

    def consume(chunks):  # noqa: ANN001, ANN202
        for chunk in chunks:
            tail.feed(chunk)

    spec = task_container(
        handle,
        "probe",
        image,
        ["sh", "-c", PROBE_SCRIPT, "probe", *worker.probe],
        user=user,
        mounts=[Mount(bundle, BUNDLE, read_only=True)],
        env={"PATH": image_path(image_env), "HOME": "/tmp"},
        own_image=True,
    )
    try:
        run = run_container(handle, spec, readers=[Reader(consume)], timeout=120)
    except EnvironmentFailed:
        raise
    except Exception as exc:  # the engine could not even start it: no /bin/sh, most often
        raise EnvironmentFailed(
            f"The environment image {image} cannot run the {worker.name} worker: a container "
            f"with `sh -c` would not start there ({exc}); use an image with /bin/sh and glibc."
        ) from exc
    code = run.exit.exit_code
    said = handle.redactor.redact(tail.text()).strip()[-300:]
    if code == NO_GLIBC:
        raise EnvironmentFailed(
            f"The environment image {image} cannot run the {worker.name} worker's CLI: it has "
            "no glibc (the CLI is linked against it); use a glibc-based image (Debian, Ubuntu, "
            "Fedora...), not Alpine/musl."
        )
    if code != 0:
        command = " ".join(worker.probe)
        raise EnvironmentFailed(
            f"The environment image {image} cannot run the {worker.name} worker's CLI: "
            f"`{command}` exited with status {code} there ({said or 'no output'}); use an "
            "image with /bin/sh and glibc."
        )
    answers.mkdir(exist_ok=True)
    partial = answers / f".{answer.name}.{os.getpid()}"
    partial.write_text(json.dumps({"probe": list(worker.probe), "image": image}))
    os.replace(partial, answer)
