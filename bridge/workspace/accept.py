"""Accept: apply exactly the verified snapshot's diff to the user's working tree, as uncommitted
changes, under the repository lock. Refusals are results (with a reason), not exceptions."""

from __future__ import annotations

import posixpath
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


def _symlink_escapes(path: str, target: str) -> bool:
    if target.startswith("/"):
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    first = resolved.split("/", 1)[0]
    return resolved == ".." or resolved.startswith("../") or first == ".git"


def apply_snapshot(home: Path, repo: Path, changes: list[Change], diff: Path) -> AcceptOutcome:
    """Apply ``diff`` to ``repo``'s working tree, or refuse leaving every file as it was."""
    git = Git(repo)
    with repository_lock(home, repo):
        for change in changes:
            if change.mode == "120000" and change.sha:
                target = git.run("cat-file", "blob", change.sha).stdout.decode(errors="replace")
                if _symlink_escapes(change.path, target):
                    return AcceptOutcome(
                        refusal=f"Refusing to accept: symlink '{change.path}' points outside the "
                        f"repository ('{target}').",
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
