"""Which repositories this bridge may touch: config `repositories` bounds every operation on a
task, not only its creation. A task whose repository lies outside it is treated as absent by the
facade (not listed, "no such task" for every verb, left alone by prune), so each front end (MCP
over stdio and HTTP, the CLI, the library) gets the same boundary from one check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bridge.errors import InvalidSpec


@dataclass(frozen=True)
class RepositoryScope:
    """The folders tasks may work in (resolved); none means any repository."""

    roots: tuple[Path, ...] = ()

    @classmethod
    def of(cls, folders: list[Path]) -> RepositoryScope:
        return cls(tuple(Path(folder).resolve() for folder in folders))

    @property
    def bounded(self) -> bool:
        return bool(self.roots)

    def allows(self, repository: str | Path) -> bool:
        """Whether a task on ``repository`` (as recorded) is inside the scope, both as the
        recorded path and as it resolves now (a folder swapped for a link does not widen it)."""
        if not self.roots:
            return True
        path = Path(repository)
        return path.is_absolute() and all(
            self._inside(candidate) for candidate in (path, path.resolve())
        )

    def _inside(self, path: Path) -> bool:
        return any(path == root or root in path.parents for root in self.roots)

    def prefixes(self) -> list[str]:
        """The roots as path strings, for a store query to narrow by (then `allows` decides)."""
        return [str(root) for root in self.roots]

    def check_new(self, repo: Path) -> None:
        """At creation: InvalidSpec unless ``repo`` is inside the scope."""
        if self.allows(repo):
            return
        allowed = ", ".join(str(r) for r in self.roots)
        raise InvalidSpec(
            f"Repository {repo} is outside the folders tasks may work in ({allowed}); move it "
            "there or add its folder to `repositories` in config.yaml."
        )
