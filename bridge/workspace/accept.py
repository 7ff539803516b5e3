"""Accept: apply exactly the verified snapshot's diff to the user's working tree, as uncommitted
changes, under the repository lock. Refusals are results (with a reason), not exceptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bridge.workspace.changes import Change
from bridge.workspace.git import Git
from bridge.workspace.locks import repository_lock


@dataclass
class AcceptOutcome:
    applied: list[str] = field(default_factory=list)
    refusal: str | None = None
    kind: str | None = None  # error kind of a refusal

    @property
    def ok(self) -> bool:
        return self.refusal is None


def _snapshot_symlinks(git: Git, snapshot: str) -> dict[str, str]:
    """Every symlink in the snapshot's tree: path -> target."""
    listing = git.run("ls-tree", "-r", "-z", "--full-tree", snapshot).stdout.split(b"\0")
    shas: dict[str, str] = {}
    for entry in listing:
        if entry.startswith(b"120000 "):
            meta, _, path = entry.partition(b"\t")
            shas[path.decode(errors="surrogateescape")] = meta.split()[2].decode()
    targets = {}
    for path, sha in shas.items():
        targets[path] = git.run("cat-file", "blob", sha).stdout.decode(errors="replace")
    return targets


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


def escaping_symlink(git: Git, snapshot: str, changes: list[Change]) -> tuple[str, str] | None:
    """The first symlink the task adds or changes that points outside the repository."""
    changed = [c.path for c in changes if c.mode == "120000"]
    if not changed:
        return None
    links = _snapshot_symlinks(git, snapshot)
    for path in changed:
        target = links.get(path, "")
        if _resolve(path.split("/")[:-1], target, links, [40]) is None:
            return path, target
    return None


def apply_snapshot(
    home: Path, repo: Path, snapshot: str, changes: list[Change], diff: Path
) -> AcceptOutcome:
    """Apply ``diff`` to ``repo``'s working tree, or refuse leaving every file as it was."""
    git = Git(repo)
    with repository_lock(home, repo):
        escape = escaping_symlink(git, snapshot, changes)
        if escape:
            return AcceptOutcome(
                refusal=f"Refusing to accept: symlink '{escape[0]}' points outside the "
                f"repository ('{escape[1]}').",
                kind="symlink_escape",
            )
        paths = sorted({p for change in changes for p in change.paths})
        if paths:
            specs = [f":(literal){p}" for p in paths]
            dirty = git.run(
                "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *specs
            ).stdout.decode(errors="replace")
            if dirty:
                first = dirty.split("\0")[0][3:]
                return AcceptOutcome(
                    refusal=f"Refusing to accept: '{first}' has uncommitted changes in {repo}; "
                    "commit or stash them, then accept again.",
                    kind="internal",
                )
        if not changes:
            return AcceptOutcome(applied=[])
        proc = git.run("apply", "--binary", "--whitespace=nowarn", "--", str(diff), check=False)
        if proc.returncode != 0:
            detail = proc.stderr.decode(errors="replace").strip().splitlines()
            return AcceptOutcome(
                refusal="Refusing to accept: the snapshot no longer applies to "
                f"{repo} ({detail[0] if detail else 'git apply failed'}); the repository moved "
                "since the task's base commit.",
                kind="internal",
            )
    return AcceptOutcome(applied=[c.path for c in changes])
