"""What a task may touch on this host, checked in the facade so every front end (MCP over stdio
and HTTP, the CLI, the library) gets the same boundary from one place:

- repositories: config `repositories` bounds every operation on a task, not only its creation.
  A task whose repository lies outside it is treated as absent (not listed, "no such task" for
  every verb, left alone by prune).
- images: a spec (or the devcontainer.json it points at) may name only images config
  `allowed_images` allows, besides this state root's own; any other is refused at creation,
  the same way whether or not the engine has it.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from bridge.config.settings import Config
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


def own_images(config: Config) -> list[str]:
    """The images a spec may always name: those `images build` makes, and the project
    environments this state root set up or built."""
    from bridge.sandbox.spec import home_id  # only creation asks; reads need not load it

    home = home_id(config.home)
    return [
        f"worker-bridge/*:{config.image_tag}",
        f"worker-bridge-env:*-{home}",
        f"worker-bridge-env-build:*-{home}",
    ]


def image_patterns(config: Config) -> list[str]:
    """The patterns an image a spec names must match: our own images, then `allowed_images`."""
    return [*own_images(config), *config.allowed_images]


def image_allowed(config: Config, ref: str) -> bool:
    return any(fnmatch.fnmatchcase(ref, pattern) for pattern in image_patterns(config))


def check_image(config: Config, ref: str, where: str) -> None:
    """At creation: InvalidSpec unless ``ref`` (as ``where`` names it) is an allowed image."""
    if not image_allowed(config, ref):
        raise InvalidSpec(
            f"{where} {ref!r} is not an image tasks may use here; the owner can allow it by "
            "adding a pattern for it to `allowed_images` in config.yaml."
        )
