"""What a setup is asked to make (`SetupPlan`) and what an environment made ready is
(`Ready`): the plain data the setup's modules pass between them, kept apart from them so none
imports another back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.documents import EnvironmentDoc
from bridge.environments.bundle import image_path
from bridge.environments.definition import EnvDefinition

if TYPE_CHECKING:
    from bridge.environments.digest import FilesCheck


@dataclass(frozen=True)
class SetupPlan:
    key: str
    files: dict[str, str]  # the dependency files that key it
    commit: str  # the commit (or tree) set up
    folder: Path  # where the entry goes
    tag: str  # the image it is committed to; for the worker's files, the image it runs in
    network: tuple[str, ...]  # the names its proxy reaches
    worker_files: bool  # a setup of the worker's snapshot
    reason: str


@dataclass
class Ready:
    """An environment made ready: what the worker and the verifier run in."""

    definition: EnvDefinition
    image: str  # the image containers start from (the setup's result, or the environment's)
    image_id: str  # the environment image's (what keys a setup of the user's files)
    image_env: dict[str, str]  # the environment image's own variables (its PATH)
    bundle: Path  # the worker's bundle, mounted at /opt/worker-bridge
    key: str | None  # the setup's cache key (None: no setup)
    files: dict[str, str]  # the dependency files that keyed it (path -> blob)
    outputs: Path | None  # cached ignored files to put into the repository's folder
    setup: str  # none | cached | ran
    paths: tuple[str, ...] = ()  # the folders and files the setup makes in the repository
    environment_image: str = ""  # the environment's image, before any setup
    commit: str = ""  # the commit (or tree) the setup's result is of
    # The folder of the sealed view the entry's files reach this task as (sealed.py): all it
    # reads of them; the entry's own files are never checked whole for it.
    sealed: Path | None = None
    # A cached entry's files, still being checked (see `confirmed` in setup.py).
    check: FilesCheck | None = field(default=None, compare=False, repr=False)

    @property
    def worker_env(self) -> dict[str, str]:
        """Variables of the worker's container: the environment's, the bundle first on PATH."""
        return {**self.definition.container_env, "PATH": image_path(self.image_env)}

    @property
    def verify_env(self) -> dict[str, str]:
        """Variables of a verification container (the image's own PATH: no CLI on it)."""
        return dict(self.definition.container_env)

    def document(self, changed_files: list[str]) -> EnvironmentDoc:
        """What a verification's result says of this environment (``changed_files``: the
        dependency files the worker changed)."""
        return EnvironmentDoc(
            source=self.definition.source,
            image=self.image,
            key=self.key,
            setup=self.setup,
            changed_files=changed_files,
        )
