"""What a task's environment is: the spec's `environment` (or the configured default for its
repository), with a devcontainer.json read from the task's base commit. Resolved at creation, so
a bad definition is refused before anything is allocated, and again by the runner (same inputs:
the base commit and the recorded spec and configuration)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.config.settings import Config
from bridge.environments.devcontainer import (
    DevcontainerBuild,
    find_devcontainer,
    parse_devcontainer,
)
from bridge.errors import InvalidSpec
from bridge.models import Environment, TaskSpec
from bridge.workspace.git import Git

if TYPE_CHECKING:
    from bridge.workspace.diff import Change

# The dependency files that key a setup's cache when `cache_key_files` is not given: manifests
# and lockfiles of the common package managers, wherever they are in the tree.
KEY_FILE_NAMES = frozenset(
    {
        "package.json", "package-lock.json", "npm-shrinkwrap.json", "yarn.lock",
        "pnpm-lock.yaml", "pnpm-workspace.yaml", "bun.lock", "bun.lockb", ".npmrc",
        "pyproject.toml", "setup.py", "setup.cfg", "poetry.lock", "uv.lock", "pdm.lock",
        "Pipfile", "Pipfile.lock", "environment.yml", "environment.yaml",
        "Cargo.toml", "Cargo.lock", "go.mod", "go.sum", "Gemfile", "Gemfile.lock",
        "composer.json", "composer.lock", "pom.xml", "build.gradle", "build.gradle.kts",
        "settings.gradle", "settings.gradle.kts", "gradle.lockfile", "mix.exs", "mix.lock",
        "Package.swift", "Package.resolved", "pubspec.yaml", "pubspec.lock",
    }
)  # fmt: skip
KEY_FILE_PATTERNS = ("requirements*.txt", "constraints*.txt", "*.csproj", "packages.lock.json")


@dataclass(frozen=True)
class EnvDefinition:
    """A resolved environment: where its image comes from, and its setup."""

    image: str | None  # the user's image (None: built from `build`)
    build: DevcontainerBuild | None
    devcontainer: str | None  # the devcontainer.json read, repository-relative
    setup: tuple[str, ...]
    setup_network: tuple[str, ...]
    container_env: dict[str, str] = field(default_factory=dict)
    cache_key_files: tuple[str, ...] | None = None
    setup_timeout_s: int = 1800

    @property
    def source(self) -> str:
        return f"devcontainer {self.devcontainer}" if self.devcontainer else f"image {self.image}"


def spec_environment(config: Config, spec: TaskSpec, repository: Path) -> Environment | None:
    """The task's environment document: its own (`{}` opts out), else the configured default
    for its repository (unless the spec names a verification image), else None (the generic
    images)."""
    if spec.environment is not None:
        chosen = spec.environment
        empty = not (chosen.image or chosen.devcontainer or chosen.setup or chosen.setup_network)
        return None if empty else chosen  # `{}`: no environment, whatever config says
    if spec.verification.image:
        return None  # a verification image of its own: the default does not apply
    for root, default in config.environments.items():
        if Path(root).expanduser().resolve() == repository.resolve():
            return default
    return None


def resolve_definition(
    config: Config, spec: TaskSpec, git: Git, base_commit: str
) -> EnvDefinition | None:
    """The task's environment (its repository ``git``'s), or None; InvalidSpec naming what is
    wrong."""
    env = spec_environment(config, spec, git.cwd)
    if env is None:
        return None
    if spec.verification.image:
        raise InvalidSpec(
            "The spec sets both `environment` and `verification.image`; verification runs in "
            "the environment, so drop one of them."
        )
    image, build, path, container_env, setup = env.image, None, None, {}, list(env.setup)
    if env.devcontainer:
        if env.image:
            raise InvalidSpec(
                "The spec's environment sets both `image` and `devcontainer`; keep one of them."
            )
        path = find_devcontainer(lambda p: read_blob(git, base_commit, p), env.devcontainer)
        text = read_blob(git, base_commit, path)
        assert text is not None  # find_devcontainer found it
        dev = parse_devcontainer(text, path)
        image, build, container_env = dev.image, dev.build, dict(dev.container_env)
        setup = [*dev.setup, *setup]
        if build is not None:
            _check_build_files(git, base_commit, path, build)
    elif not env.image:
        raise InvalidSpec(
            "The spec's environment names no image; set `environment.image` to an image in "
            "this engine, or `environment.devcontainer` to true."
        )
    from bridge.gateway.policy import check_domains

    try:
        domains = tuple(check_domains(env.setup_network))
    except InvalidSpec as exc:
        message = exc.message.replace("network.domains", "environment.setup_network")
        raise InvalidSpec(message) from exc
    if env.cache_key_files is not None:
        listing = tree_files(git, base_commit)
        for pattern in env.cache_key_files:
            if not any(fnmatch.fnmatchcase(p, pattern) for p in listing):
                raise InvalidSpec(
                    f"environment.cache_key_files names '{pattern}', which matches no file at "
                    f"the base commit {base_commit[:12]}; fix the path or leave the key out."
                )
    return EnvDefinition(
        image=image,
        build=build,
        devcontainer=path,
        setup=tuple(setup),
        setup_network=domains,
        container_env=container_env,
        cache_key_files=tuple(env.cache_key_files) if env.cache_key_files is not None else None,
        setup_timeout_s=env.setup_timeout_seconds or config.setup_timeout_s,
    )


def read_blob(git: Git, commit: str, path: str) -> bytes | None:
    """The file at ``path`` in ``commit``, or None when there is none (or it is not a file)."""
    proc = git.run("cat-file", "-t", f"{commit}:{path}", check=False)
    if proc.returncode != 0 or proc.stdout.strip() != b"blob":
        return None
    return git.run("cat-file", "blob", f"{commit}:{path}").stdout


def tree_files(git: Git, commit: str) -> dict[str, str]:
    """Every file of ``commit``: path -> blob id (links and submodules left out)."""
    out = git.run("ls-tree", "-r", "-z", "--full-tree", commit).stdout
    files: dict[str, str] = {}
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, name = record.partition(b"\t")
        mode, kind, blob = meta.split(b" ")
        if kind == b"blob" and mode != b"120000":
            files[name.decode("utf-8", "surrogateescape")] = blob.decode()
    return files


def key_files(definition: EnvDefinition, files: dict[str, str]) -> dict[str, str]:
    """The dependency files (path -> blob id) of a tree that key the setup's cache."""
    if definition.cache_key_files is not None:
        return {
            path: blob
            for path, blob in files.items()
            if any(fnmatch.fnmatchcase(path, p) for p in definition.cache_key_files)
        }
    chosen = {}
    for path, blob in files.items():
        name = path.rsplit("/", 1)[-1]
        if name in KEY_FILE_NAMES or any(fnmatch.fnmatchcase(name, p) for p in KEY_FILE_PATTERNS):
            chosen[path] = blob
    if definition.build is not None:  # the Dockerfile and its context key the built image
        chosen.update({p: b for p, b in files.items() if p == definition.build.dockerfile})
    return chosen


def key_files_after(
    definition: EnvDefinition, files: dict[str, str], changes: list[Change]
) -> dict[str, str]:
    """The dependency files of the tree ``changes`` (path, mode and blob, as `git diff --raw`
    gives them) lead to from a tree whose dependency files are ``files``: what `key_files` of
    that tree's `tree_files` is, without listing the whole tree again."""
    after = dict(files)
    for change in changes:
        for path in change.paths:  # changed, deleted, or the source of a rename: gone as it was
            after.pop(path, None)
        if change.sha is not None and change.mode not in (None, "120000", "160000"):
            after.update(key_files(definition, {change.path: change.sha}))
    return after


def _check_build_files(git: Git, commit: str, path: str, build: DevcontainerBuild) -> None:
    if read_blob(git, commit, build.dockerfile) is None:
        raise InvalidSpec(
            f"{path} builds from {build.dockerfile}, which is not a file at the base commit "
            f"{commit[:12]}; commit it or fix `build.dockerfile`."
        )
