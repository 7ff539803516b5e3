"""What a node is given for a task, from the control host (bridge/pipeline/node_turn.py sends
it): the images by this host's id (pulled by the node from the registry, or streamed from this
host's engine), the bundles of the task's base and snapshot it lacks (its copy of the repository
kept under the repository's `repo_id`), and the ignore rules from outside the repository's
tree."""

from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path

from bridge.cluster.bundles import base_bundle, bundle_bytes
from bridge.cluster.link import AgentLink
from bridge.cluster.orders import ImageOrder
from bridge.errors import ImageMissing
from bridge.phase.handle import PhaseHandle
from bridge.workspace.git import Git, common_git_dir
from bridge.workspace.rawgit import repo_id
from bridge.workspace.worktree import TaskWorkspace

STREAM_PART = 8 << 20  # an image streamed to a node without a registry, per call


def outside_excludes(repository: Path) -> str:
    """The ignore rules that apply to ``repository`` from outside its tree, as git reads them
    here: this user's core.excludesFile (or git's default one), then the repository's
    .git/info/exclude, which wins where both match (later lines win in one file). A node's
    copy of the repository takes them instead of its own machine's, so its collect leaves out
    what this host's would."""
    git = Git(repository)
    found = git.run("config", "--get", "core.excludesFile", check=False)
    if found.returncode == 0 and found.stdout.strip():
        personal = Path(os.path.expanduser(found.stdout.decode().strip()))
    else:
        config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        personal = Path(config_home) / "git" / "ignore"
    parts = []
    for source in (personal, common_git_dir(repository) / "info" / "exclude"):
        try:
            parts.append(source.read_text(encoding="utf-8", errors="surrogateescape"))
        except OSError:
            continue
    return "\n".join(parts)


_giving: dict[tuple[str, str], threading.Lock] = {}
_giving_lock = threading.Lock()


def give_image(handle: PhaseHandle, link: AgentLink, node: str, image: ImageOrder) -> None:
    """Without a registry: the image streamed from this host's engine to the node that lacks
    it (once per node and image at a time in this process); the node checks its id."""
    if image.pull is not None:
        return  # the node pulls it by digest
    with _giving_lock:
        lock = _giving.setdefault((node, image.image_id), threading.Lock())
    with lock:
        if link.has_image(image.reference, image.image_id):
            return
        from bridge.sandbox import distribution

        began, upload, sent, index = time.monotonic(), secrets.token_hex(8), 0, 0
        part = bytearray()
        for chunk in distribution.save(handle.ctx.sandbox, image.image_id):  # type: ignore[arg-type]
            part += chunk
            if len(part) >= STREAM_PART:
                link.image_part(upload, index, bytes(part))
                sent, index = sent + len(part), index + 1
                part.clear()
        link.image_part(upload, index, bytes(part))
        link.image_done(upload, image.reference, image.image_id)
        seconds = round(time.monotonic() - began, 3)
        data = {"node": node, "image": image.reference, "bytes": sent + len(part)}
        handle.emit("cluster.image_sent", {**data, "seconds": seconds})


def image_order(handle: PhaseHandle, reference: str) -> ImageOrder:
    """The image by this host's id, and where a node pulls it from (the registry in config,
    pushed there once per id)."""
    ctx = handle.ctx
    info = ctx.sandbox.inspect_image(reference)
    if info is None:
        raise ImageMissing(
            f"Image {reference} is not present on the control host; build it first "
            "(`worker-bridge images build`)."
        )
    pull = None
    cluster = ctx.config.cluster
    if cluster.registry:
        from bridge.cluster.images import Registry, publish

        registry = Registry(cluster.registry, cluster.node_registry)
        pull = publish(ctx.sandbox, reference, info.id, registry)  # type: ignore[arg-type]
    return ImageOrder(reference, info.id, pull)


def bundles_lacking(
    handle: PhaseHandle, link: AgentLink, ws: TaskWorkspace, snapshot: str | None = None
) -> tuple[bytes, ...]:
    """The bundles of the task's base (made once per commit, kept in this state root) and of
    ``snapshot`` (thin on the base) that the node on ``link`` does not hold yet."""
    base = handle.record.base_commit or ""
    wanted = [base] if snapshot is None else [base, snapshot]
    missing = link.missing(repo_id(ws.repository), wanted)
    bundles = []
    if base in missing:
        bundles.append(base_bundle(ws.repository, base, handle.ctx.home / "bundles").read_bytes())
    if snapshot is not None and snapshot in missing:
        bundles.append(bundle_bytes(ws.repository, snapshot, exclude=base))
    return tuple(bundles)
