"""`worker-bridge environments list|prune`: the setup caches of this state root, and reclaiming
them. Prune removes (dry run unless applied) entries not used for `retention_days`, then, while
free disk under the state root is below the reserve, the least recently used ones; `--all`
removes every entry and the images built from devcontainer Dockerfiles. Images of this state
root's environments that no entry names any more (a crash between the two) go too, but never a
task-private one while its task runs; so do worker bundles whose image is gone. An entry is
removed folder first, so no task trusts it while its image goes. Under a bounded scope (config
`repositories`), entries of other repositories are neither listed nor pruned, and the engine's
images and bundles, which every repository shares, are left alone."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TypedDict

from bridge.documents import PruneReport, Removal
from bridge.environments.cache import Entry, cache_root, entries, remove_entry, sweep_partials
from bridge.errors import TaskNotFound
from bridge.models import TERMINAL
from bridge.phase.context import Context
from bridge.sandbox import LABEL, home_id
from bridge.scope import RepositoryScope
from bridge.workspace.disk import reserve_bytes
from bridge.workspace.fs import remove_tree

DAY = 86400.0


class Listed(TypedDict, total=False):
    """One cache entry as `environments list` shows it (an unreadable one: its key, state and
    folder only)."""

    key: str
    state: str  # ready | unreadable
    folder: str
    image: str
    repository: str | None
    source: str | None
    setup: list[str] | None
    key_files: dict[str, str] | None
    files: int | None
    bytes: int | None
    created_at: str | None
    last_used: str


def _mine(item: Entry | Path, scope: RepositoryScope) -> bool:
    if not scope.bounded:
        return True
    repository = item.record.get("repository") if isinstance(item, Entry) else None
    return bool(repository) and scope.allows(str(repository))


def list_environments(ctx: Context, scope: RepositoryScope) -> list[Listed]:
    """One document per cache entry in scope, most recently used first (unreadable ones
    included when the scope is not bounded)."""
    found: list[Listed] = []
    for item in entries(ctx.home):
        if not _mine(item, scope):
            continue
        if isinstance(item, Path):
            found.append(Listed(key=item.name, state="unreadable", folder=str(item)))
            continue
        found.append(_document(item))
    found.sort(key=lambda d: d.get("last_used") or "", reverse=True)
    return found


def _document(entry: Entry) -> Listed:
    record = entry.record
    return Listed(
        key=entry.key,
        state="ready",
        image=entry.image,
        repository=record.get("repository"),
        source=record.get("source"),
        setup=record.get("setup"),
        key_files=record.get("key_files"),
        files=record.get("files"),
        bytes=record.get("bytes"),
        created_at=record.get("created_at"),
        last_used=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.last_used)),
        folder=str(entry.folder),
    )


def prune_environments(
    ctx: Context, scope: RepositoryScope, *, apply: bool = False, everything: bool = False
) -> PruneReport:
    """What prune removes (and removes it when ``apply``), with the reason for each."""
    actions: list[Removal] = []
    now = time.time()
    keep_s = ctx.config.retention_days * DAY
    live: list[Entry] = []
    others: list[Entry] = []  # outside the scope: kept, and their images with them
    for item in entries(ctx.home):
        if not _mine(item, scope):
            if isinstance(item, Entry):
                others.append(item)
        elif isinstance(item, Path):
            actions.append(_action("entry", item, None, "its record is unreadable"))
        elif everything:
            actions.append(_action("entry", item.folder, item, "--all"))
        elif now - item.last_used > keep_s:
            days = int((now - item.last_used) // DAY)
            actions.append(_action("entry", item.folder, item, f"unused for {days} days"))
        else:
            live.append(item)
    free = shutil.disk_usage(ctx.home if ctx.home.exists() else ctx.home.parent).free
    freed = sum(a["bytes"] for a in actions)
    reserve = reserve_bytes(ctx.home, ctx.config.disk_reserve_gb)
    for item in sorted(live, key=lambda e: e.last_used):
        if free + freed >= reserve:
            break
        actions.append(_action("entry", item.folder, item, "free disk is below the reserve"))
        freed += actions[-1]["bytes"]
    named = {a["image"] for a in actions if a["image"]} | {e.image for e in live + others}
    ours = {f"{LABEL}.home": home_id(ctx.home), f"{LABEL}.role": "environment"}
    for image in [] if scope.bounded else ctx.sandbox.images(ours):
        tags = [t for t in image.tags if t.startswith("worker-bridge-env")]
        built = any(t.startswith("worker-bridge-env-build:") for t in tags)
        if any(t in named for t in tags) or (built and not everything) or _in_use(ctx, tags):
            continue
        why = "--all" if built else "no cache entry names it"
        target = tags[0] if tags else image.id
        actions.append(
            Removal(kind="image", target=target, image=None, bytes=image.size, reason=why)
        )
    if not scope.bounded:
        actions += _stale_bundles(ctx)
    if apply:
        for action in actions:
            if action["kind"] == "entry":
                remove_entry(Path(action["target"]), action["image"], ctx.sandbox.remove_image)
            elif action["kind"] == "bundle":
                remove_tree(Path(action["target"]))
            else:
                ctx.sandbox.remove_image(action["target"])
        sweep_partials(ctx.home)
    return PruneReport(applied=apply, actions=actions, root=str(cache_root(ctx.home)))


def _action(kind: str, folder: Path, entry: Entry | None, reason: str) -> Removal:
    return Removal(
        kind=kind,
        target=str(folder),
        image=entry.image if entry else None,
        bytes=int(entry.record.get("bytes") or 0) if entry else 0,
        reason=reason,
    )


def _in_use(ctx: Context, tags: list[str]) -> bool:
    """Whether a tag is a task-private setup's (`...-<home>-<task id>`) of a task that has not
    ended: its verification may be using it."""
    for tag in tags:
        parts = tag.rsplit(":", 1)[-1].split("-")
        if len(parts) == 3:
            try:
                if ctx.store.status(parts[2]) not in TERMINAL:
                    return True
            except TaskNotFound:
                continue
    return False


def _stale_bundles(ctx: Context) -> list[Removal]:
    """Worker bundles copied out of images that are no longer in the engine."""
    root = ctx.home / "bundles"
    if not root.is_dir():
        return []
    stale: list[Removal] = []
    for folder in sorted(root.iterdir()):
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        if ctx.sandbox.inspect_image(f"sha256:{folder.name}") is None:
            reason = "its worker image is no longer in the engine"
            stale.append(_action("bundle", folder, None, reason))
    return stale
