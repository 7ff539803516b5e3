"""The setup's result inside the repository: the ignored, untracked files its commands made in
the checkout (by the tree's own ignore rules), moved into a new cache entry, stripped of special
files, sealed read-only, with a digest of the whole, and renamed into place."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from bridge.environments.cache import ENTRY_FILE, OUTPUTS, Entry, load_entry, seal
from bridge.environments.definition import EnvDefinition
from bridge.environments.digest import tree_digest
from bridge.environments.ready import SetupPlan
from bridge.errors import EnvironmentFailed
from bridge.phase.handle import PhaseHandle
from bridge.store.db import now_iso
from bridge.workspace.fs import remove_tree, walk_all
from bridge.workspace.rawgit import raw_git


def keep_outputs(
    handle: PhaseHandle, checkout: Path, partial: Path, plan: SetupPlan, definition: EnvDefinition
) -> Entry:
    """Move the ignored files the setup made into a new entry, seal it (the host's, read-only),
    and put it in place."""
    ctx = handle.ctx
    outputs = partial / OUTPUTS
    outputs.mkdir(parents=True)
    paths = ignored_paths(handle, checkout, plan.commit)
    for rel in paths:
        _move(checkout, outputs, rel)
    _drop_specials(outputs)
    if os.geteuid() == 0:  # a setup of the worker's files ran as the sandbox user
        for rel, _ in walk_all(outputs):
            os.chown(outputs / rel, 0, 0, follow_symlinks=False)
    seal(outputs)
    digest, count, size = tree_digest(outputs)
    info = ctx.sandbox.inspect_image(plan.tag)
    if info is None:
        raise EnvironmentFailed(f"The setup's image {plan.tag} is missing; run the task again.")
    record = {
        "key": plan.key,
        "image": plan.tag,
        "image_id": info.id,
        "digest": digest,
        "files": count,
        "bytes": size,
        "paths": sorted(paths),
        "created_at": now_iso(),
        "nonce": os.urandom(8).hex(),  # an entry made again is another entry (see shared_view)
        "repository": handle.record.repository,
        "commit": plan.commit,
        "source": definition.source,
        "setup": list(definition.setup),
        "key_files": sorted(plan.files),
        "for": "snapshot" if plan.worker_files else "base",
    }
    (partial / ENTRY_FILE).write_text(json.dumps(record, indent=1))
    if plan.folder.exists():
        remove_tree(plan.folder)
    os.rename(partial, plan.folder)
    entry = load_entry(plan.folder)
    assert entry is not None
    return entry


def ignored_paths(handle: PhaseHandle, checkout: Path, commit: str) -> list[str]:
    """The ignored, untracked paths in ``checkout`` (folders whole), by git's standard rules:
    the tree's .gitignore files, and the bridge user's own core.excludesFile."""
    ctx = handle.ctx
    index = checkout.parent / "ignored.index"
    git = raw_git(ctx.home, Path(handle.record.repository), work_tree=checkout)
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        git.run("read-tree", commit, env=env)
        out = git.run(
            "ls-files",
            "-z",
            "--others",
            "--ignored",
            "--exclude-standard",
            "--directory",
            env=env,
        ).stdout
    finally:
        index.unlink(missing_ok=True)
    return [os.fsdecode(p).rstrip("/") for p in out.split(b"\0") if p]


def _move(checkout: Path, outputs: Path, rel: str) -> None:
    """Move ``rel`` from the checkout into the outputs, its parents made as plain folders (a
    parent that is not a folder, such as a link the setup planted, is not followed)."""
    parts = rel.split("/")
    here, there = checkout, outputs
    for part in parts[:-1]:
        here, there = here / part, there / part
        if not stat.S_ISDIR(os.lstat(here).st_mode):
            return
        there.mkdir(exist_ok=True)
    os.rename(checkout / rel, outputs / rel)


def _drop_specials(outputs: Path) -> None:
    """FIFOs, sockets and device files are never cached."""
    for rel, st in list(walk_all(outputs)):
        kind = stat.S_IFMT(st.st_mode)
        if kind not in (stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK):
            os.unlink(outputs / rel)
