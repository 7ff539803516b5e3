"""Accept's check of the snapshot's symlinks: none that the task adds or changes may point outside
the repository, also through the snapshot's other links (the writing is `writer.py`, the
orchestration `pipeline/accepting.py`)."""

from __future__ import annotations

import os
from pathlib import Path

from bridge.workspace.changes import Change
from bridge.workspace.git import Git


def _snapshot_symlinks(git: Git, snapshot: str) -> dict[str, str]:
    """Every symlink in the snapshot's tree: path -> target."""
    listing = git.run("ls-tree", "-r", "-z", "--full-tree", snapshot).stdout.split(b"\0")
    shas: dict[str, str] = {}
    for entry in listing:
        if entry.startswith(b"120000 "):
            meta, _, path = entry.partition(b"\t")
            shas[os.fsdecode(path)] = meta.split()[2].decode()
    if not shas:
        return {}
    # One `cat-file --batch` for all of them: "<sha> blob <size>\n<data>\n" each.
    out = git.run("cat-file", "--batch", input="".join(f"{s}\n" for s in shas.values()).encode())
    data, pos, blobs = out.stdout, 0, {}
    for sha in shas.values():
        header_end = data.index(b"\n", pos)
        size = int(data[pos:header_end].split()[2])
        blobs[sha] = data[header_end + 1 : header_end + 1 + size].decode(errors="replace")
        pos = header_end + 1 + size + 1
    return {path: blobs[sha] for path, sha in shas.items()}


def _resolve(
    base: list[str], target: str, links: dict[str, str], budget: list[int]
) -> list[str] | None:
    """Resolve ``target`` relative to the directory ``base`` inside the repository, following
    the snapshot's symlinks. None when it leaves the repository, enters .git, or loops."""
    if target.startswith("/"):
        return None
    stack = list(base)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return None
            stack.pop()
            continue
        stack.append(part)
        if stack[0].lower() == ".git":
            return None
        link = links.get("/".join(stack))
        if link is not None:
            budget[0] -= 1
            if budget[0] < 0:
                return None
            resolved = _resolve(stack[:-1], link, links, budget)
            if resolved is None:
                return None
            stack = resolved
    return stack


def escaping_symlink(
    git: Git, snapshot: str, changes: list[Change], repo: Path | None = None
) -> tuple[str, str] | None:
    """The first symlink the task adds or changes that points outside the repository, through
    the snapshot's own links, or (given ``repo``, the user's tree) through a symlink of the
    user's that the snapshot does not have (an untracked `venv -> /usr`)."""
    changed = [c.path for c in changes if c.mode == "120000"]
    if not changed:
        return None
    links = _snapshot_symlinks(git, snapshot)
    for path in changed:
        target = links.get(path, "")
        resolved = _resolve(path.split("/")[:-1], target, links, [40])
        if resolved is None or (repo is not None and _through_user_link(repo, resolved, links)):
            return path, target
    return None


def _through_user_link(repo: Path, parts: list[str], links: dict[str, str]) -> bool:
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if prefix not in links and os.path.islink(repo / prefix):
            return True
    return False
