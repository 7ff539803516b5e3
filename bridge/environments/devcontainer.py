"""A repository's devcontainer.json, read into what worker-bridge can honour: an image or a
Dockerfile build, environment variables, and setup commands. Anything else is refused by name.

The sandbox is not an editor's dev container: the repository is always mounted at /workspace
(so `workspaceFolder` is ignored), nothing runs on the host, no container outlives the task,
and the sandbox's privileges, mounts and network are worker-bridge's, never the repository's.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import json5

from bridge.errors import InvalidSpec
from bridge.models import JsonObject

DEVCONTAINER_PATHS = (".devcontainer/devcontainer.json", ".devcontainer.json")

# json5 is pure Python and slow (about 1 s for 64 KiB); real devcontainer.json files are a few KiB.
MAX_BYTES = 64 * 1024

LIFECYCLE_COMMANDS = ("onCreateCommand", "updateContentCommand", "postCreateCommand")

_RECORDED = frozenset(
    {"image", "build", "dockerFile", "context", "containerEnv", "remoteEnv"}
    | {"containerUser", "remoteUser", *LIFECYCLE_COMMANDS}
)

# Keys that only concern an editor, port forwarding or the container's lifetime in an editor.
# `extensions`, `settings` and `devPort` are the editor keys from before `customizations`.
_IGNORED = frozenset(
    {"name", "customizations", "forwardPorts", "portsAttributes", "otherPortsAttributes"}
    | {"$schema", "shutdownAction", "overrideCommand", "waitFor", "userEnvProbe"}
    | {"updateRemoteUserUID", "hostRequirements", "workspaceFolder"}
    | {"extensions", "settings", "devPort"}
)

_FIXED = "the sandbox's {} are worker-bridge's to set; remove it"
_COMPOSE = (
    "it belongs to compose-based devcontainers; point `image` or `build.dockerfile` at the "
    "compose service's image or Dockerfile instead"
)
_FEATURES = "bake them into the image or the Dockerfile instead"

# Key -> what to do instead, for the keys of the devcontainer spec that worker-bridge refuses.
_UNSUPPORTED = {
    "features": _FEATURES,
    "overrideFeatureInstallOrder": _FEATURES,
    "runArgs": _FIXED.format("`docker run` options"),
    "mounts": _FIXED.format("mounts"),
    "workspaceMount": _FIXED.format("mounts"),
    "privileged": _FIXED.format("privileges"),
    "capAdd": _FIXED.format("privileges"),
    "securityOpt": _FIXED.format("privileges"),
    "init": _FIXED.format("process options"),
    "appPort": _FIXED.format("network settings"),
    "dockerComposeFile": _COMPOSE,
    "service": _COMPOSE,
    "runServices": _COMPOSE,
    "initializeCommand": (
        "it would run on the host, and worker-bridge never runs a repository's commands there; "
        "move it into onCreateCommand or the Dockerfile"
    ),
    "postStartCommand": (
        "there is no long-running container to start; move it to postCreateCommand"
    ),
    "postAttachCommand": (
        "there is no long-running container to attach to; move it to postCreateCommand"
    ),
}

_BUILD_KEYS = frozenset({"dockerfile", "context", "args", "target"})
_BUILD_UNSUPPORTED = {
    "cacheFrom": "worker-bridge keeps its own build cache; remove it",
    "options": _FIXED.format("`docker build` options"),
}

# Docker passes image names, build arguments and environment values on verbatim, so any
# `${...}` in them is a devcontainer variable, which would bring host values into the sandbox.
_ANY_VARIABLE = re.compile(r"\$\{[^}]*\}")
# Commands run in a shell, where `${HOME}` is the shell's; only the spec's variables are refused.
_SPEC_VARIABLE = re.compile(
    r"\$\{(?:(?:localEnv|containerEnv|env):[^}]*"
    r"|(?:local|container)WorkspaceFolder(?:Basename)?|devcontainerId)\}"
)
_JSON5_ERROR = re.compile(r"<string>:(\d+) (.*)", re.DOTALL)


@dataclass(frozen=True)
class DevcontainerBuild:
    dockerfile: str
    """Repository-relative POSIX path of the Dockerfile (always inside `context`)."""
    context: str
    """Repository-relative POSIX path of the build context folder ("." = repository root)."""
    args: dict[str, str]
    """`build.args`, literal strings."""
    target: str | None
    """`build.target`: the Dockerfile stage to build, or None for the last one."""


@dataclass(frozen=True)
class Devcontainer:
    path: str
    """Repository-relative path of the devcontainer.json read."""
    image: str | None
    """`image`; exactly one of `image` and `build` is set."""
    build: DevcontainerBuild | None
    """`build`, or the legacy top-level `dockerFile`/`context`."""
    container_env: dict[str, str]
    """`containerEnv`, then `remoteEnv` (which wins for a name in both), literal values only."""
    setup: list[str]
    """onCreateCommand, updateContentCommand, postCreateCommand, in that order, as shell commands
    (an array is exec form, joined with shell quoting; named commands keep their order)."""
    container_user: str | None
    """`containerUser`, else `remoteUser`, if given (informational: the sandbox picks its uid)."""


def find_devcontainer(read: Callable[[str], bytes | None], requested: str | bool) -> str:
    """The repository-relative path of the devcontainer.json to read.

    `requested` is the spec's `environment.devcontainer`: True takes the first of
    DEVCONTAINER_PATHS that `read` finds; a string is that path (relative, inside the
    repository, without `..`). `read(path)` gives a file's bytes at the base commit, or None.
    Raises InvalidSpec naming what is missing; ValueError for False (nothing to find).
    """
    if requested is True:
        for candidate in DEVCONTAINER_PATHS:
            if read(candidate) is not None:
                return candidate
        raise InvalidSpec(
            f"`environment.devcontainer` is true but the repository has neither "
            f"{' nor '.join(DEVCONTAINER_PATHS)} at the base commit; add one or name its path."
        )
    if not isinstance(requested, str) or isinstance(requested, bool):
        raise ValueError(f"find_devcontainer needs True or a path, not {requested!r}")
    parts = requested.split("/")
    if (
        requested.startswith("/")
        or ".." in parts
        or "\\" in requested
        or "\x00" in requested
        or not [part for part in parts if part not in ("", ".")]
    ):
        raise InvalidSpec(
            f"`environment.devcontainer` is {requested!r}; give a file path relative to the "
            f"repository root, without `..`, or true to look in {' and '.join(DEVCONTAINER_PATHS)}."
        )
    path = "/".join(part for part in parts if part not in ("", "."))
    if read(path) is None:
        raise InvalidSpec(
            f"`environment.devcontainer` names {path}, which is not a file in the repository at "
            f"the base commit; fix the path or commit the file."
        )
    return path


def parse_devcontainer(text: bytes | str, path: str) -> Devcontainer:
    """Parse and validate the devcontainer.json at repository-relative `path`.

    Raises InvalidSpec, with one sentence naming the file and the key, on anything worker-bridge
    cannot honour. Paths in `build` are relative to the folder holding the file (as in the
    devcontainer spec) and come back relative to the repository root.
    """
    doc = _load(text, path)
    for key in doc:
        if key in _UNSUPPORTED:
            raise InvalidSpec(
                f"{path} uses `{key}`, which worker-bridge does not support; {_UNSUPPORTED[key]}."
            )
        if key not in _RECORDED and key not in _IGNORED:
            raise InvalidSpec(f"{path} uses `{key}`, which worker-bridge does not know; remove it.")
    if "image" in doc and ("build" in doc or "dockerFile" in doc):
        build_key = "build" if "build" in doc else "dockerFile"
        raise InvalidSpec(f"{path} gives both `image` and `{build_key}`; keep only one of them.")
    image = _image(doc, path)
    build = _build(doc, _folder(path), path)
    if image is None and build is None:
        raise InvalidSpec(
            f"{path} names neither `image` nor `build.dockerfile`; give one of them so "
            f"worker-bridge knows what to run in."
        )
    return Devcontainer(
        path=path,
        image=image,
        build=build,
        container_env=_environment(doc, path),
        setup=_setup(doc, path),
        container_user=_user(doc, path),
    )


def _load(text: bytes | str, path: str) -> JsonObject:
    if len(text) > MAX_BYTES:
        raise InvalidSpec(
            f"{path} is larger than {MAX_BYTES // 1024} KiB; keep the devcontainer.json small."
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise InvalidSpec(f"{path} is not UTF-8 text; save it as UTF-8.") from None
    try:
        doc = json5.loads(text.removeprefix("\ufeff"), allow_duplicate_keys=False)
    except RecursionError:
        raise InvalidSpec(f"{path} is nested too deeply to read; flatten it.") from None
    except ValueError as exc:
        raise InvalidSpec(
            f"{path} is not valid JSON with comments ({_syntax_error(exc)}); fix its syntax."
        ) from exc
    if not isinstance(doc, dict):
        raise InvalidSpec(f"{path} holds {_kind(doc)}, not a JSON object; make it an object.")
    return doc


def _syntax_error(exc: ValueError) -> str:
    """json5's message, with its `<string>:LINE` turned into `line LINE`, printable and cut."""
    message = str(exc)
    match = _JSON5_ERROR.match(message)
    if match:
        message = f"line {match[1]}: {match[2]}"
    return "".join(c if c.isprintable() else "?" for c in message)[:200]


def _image(doc: JsonObject, path: str) -> str | None:
    if "image" not in doc:
        return None
    image = _literal(doc["image"], "image", path).strip()
    if not image:
        raise InvalidSpec(f"{path} gives an empty `image`; name an image or remove the key.")
    return image


def _build(doc: JsonObject, folder: str, path: str) -> DevcontainerBuild | None:
    if "build" in doc:
        if "dockerFile" in doc or "context" in doc:
            legacy = "dockerFile" if "dockerFile" in doc else "context"
            raise InvalidSpec(
                f"{path} gives both `build` and the legacy `{legacy}`; keep only `build`."
            )
        build = doc["build"]
        if not isinstance(build, dict):
            raise InvalidSpec(f"{path}: `build` must be an object, not {_kind(build)}.")
        for key in build:
            if key in _BUILD_UNSUPPORTED:
                raise InvalidSpec(
                    f"{path} uses `build.{key}`, which worker-bridge does not support; "
                    f"{_BUILD_UNSUPPORTED[key]}."
                )
            if key not in _BUILD_KEYS:
                raise InvalidSpec(
                    f"{path} uses `build.{key}`, which worker-bridge does not know; remove it."
                )
        if "dockerfile" not in build:
            raise InvalidSpec(
                f"{path} has `build` without `build.dockerfile`; name the Dockerfile there or "
                f"use `image` instead."
            )
        keys = ("build.dockerfile", "build.context")
        values = (build["dockerfile"], build.get("context", "."))
        args, target = _args(build.get("args", {}), path), _target(build, path)
    elif "dockerFile" in doc:
        keys = ("dockerFile", "context")
        values = (doc["dockerFile"], doc.get("context", "."))
        args, target = {}, None
    elif "context" in doc:
        raise InvalidSpec(
            f"{path} gives `context` without `dockerFile`; use `build.dockerfile` and "
            f"`build.context` together, or remove it."
        )
    else:
        return None
    dockerfile = _repo_path(values[0], keys[0], folder, path)
    context = _repo_path(values[1], keys[1], folder, path)
    if dockerfile == context or not (context == "." or dockerfile.startswith(context + "/")):
        raise InvalidSpec(
            f"{path}: `{keys[0]}` ({dockerfile}) does not lie inside the build context "
            f"`{keys[1]}` ({context}); move the Dockerfile into the context or widen the context."
        )
    return DevcontainerBuild(dockerfile=dockerfile, context=context, args=args, target=target)


def _args(value: Any, path: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidSpec(f"{path}: `build.args` must be an object, not {_kind(value)}.")
    return {name: _literal(arg, f"build.args.{name}", path) for name, arg in value.items()}


def _target(build: JsonObject, path: str) -> str | None:
    if "target" not in build:
        return None
    target = _literal(build["target"], "build.target", path).strip()
    if not target:
        raise InvalidSpec(f"{path} gives an empty `build.target`; name a stage or remove it.")
    return target


def _folder(path: str) -> str:
    """The folder holding `path`, as the starting point of relative paths ("" = root)."""
    return path.rpartition("/")[0]


def _repo_path(value: Any, key: str, folder: str, path: str) -> str:
    """`value`, relative to `folder`, as a normalised repository-relative POSIX path."""
    text = _literal(value, key, path)
    if not text.strip():
        raise InvalidSpec(f"{path} gives an empty `{key}`; name a path relative to {path}.")
    if text.startswith("/") or "\\" in text or "\x00" in text:
        raise InvalidSpec(
            f"{path}: `{key}` is {text!r}; give a path relative to the folder holding {path}, "
            f"with forward slashes."
        )
    parts: list[str] = []
    for part in [*folder.split("/"), *text.split("/")]:
        if part == "..":
            if not parts:
                raise InvalidSpec(
                    f"{path}: `{key}` ({text}) points outside the repository; keep it inside."
                )
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts) or "."


def _environment(doc: JsonObject, path: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for key in ("containerEnv", "remoteEnv"):
        table = doc.get(key, {})
        if not isinstance(table, dict):
            raise InvalidSpec(f"{path}: `{key}` must be an object, not {_kind(table)}.")
        for name, value in table.items():
            if not name or "=" in name or "\x00" in name:
                raise InvalidSpec(
                    f"{path}: `{key}` has a variable named {name!r}, which is not a valid "
                    f"environment variable name; rename it."
                )
            env[name] = _literal(value, f"{key}.{name}", path)
    return env


def _setup(doc: JsonObject, path: str) -> list[str]:
    commands: list[str] = []
    for key in LIFECYCLE_COMMANDS:
        if key not in doc:
            continue
        value = doc[key]
        if isinstance(value, dict):
            for name, command in value.items():
                commands.extend(_command(command, f"{key}.{name}", path))
        else:
            commands.extend(_command(value, key, path))
    return commands


def _command(value: Any, key: str, path: str) -> list[str]:
    """One lifecycle command as a shell string, or nothing when it is empty."""
    if isinstance(value, str):
        shell = value
    elif isinstance(value, list) and all(isinstance(word, str) for word in value):
        shell = shlex.join(value)
    else:
        raise InvalidSpec(
            f"{path}: `{key}` must be a shell command string or an array of strings, "
            f"not {_kind(value)}."
        )
    _refuse_variable(shell, key, path, _SPEC_VARIABLE)
    return [shell] if shell.strip() else []


def _user(doc: JsonObject, path: str) -> str | None:
    for key in ("containerUser", "remoteUser"):
        if key in doc:
            user = _literal(doc[key], key, path).strip()
            if not user:
                raise InvalidSpec(f"{path} gives an empty `{key}`; name a user or remove it.")
            return user
    return None


def _literal(value: Any, key: str, path: str) -> str:
    """`value` when it is a string without devcontainer variables."""
    if not isinstance(value, str):
        hint = "; quote it" if isinstance(value, int | float) else ""
        raise InvalidSpec(f"{path}: `{key}` must be a string, not {_kind(value)}{hint}.")
    _refuse_variable(value, key, path, _ANY_VARIABLE)
    return value


def _refuse_variable(value: str, key: str, path: str, pattern: re.Pattern[str]) -> None:
    match = pattern.search(value)
    if match is None:
        return
    hint = " (the repository is at /workspace)" if "WorkspaceFolder" in match[0] else ""
    raise InvalidSpec(
        f"{path}: `{key}` uses the variable `{match[0]}`, which worker-bridge does not "
        f"substitute into a sandbox; write the value literally{hint}."
    )


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a string"
