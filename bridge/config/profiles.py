"""Task types and their profiles: `metadata.type` (the CLI's `--type`, MCP's `type`) names a profile
whose fields fill what the caller left unset in the spec, never what it set. Filling happens in one
place, task creation (bridge/pipeline/creation.py), which every front end and every job reaches. The
built-in types are below; config `profiles` adds types or overrides fields of a built-in one, so the
known types are always the configuration's."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from bridge.config.settings import Config, TaskProfile
from bridge.errors import InvalidSpec
from bridge.models import JsonObject, TaskSpec


@with_config(ConfigDict(extra="allow"))
class AppliedProfile(TypedDict):
    """The task type's profile as creation applied it: its type and the spec fields it filled
    (recorded with the task, shown in its result)."""

    type: str
    filled: list[str]


BUILTIN_PROFILES: dict[str, TaskProfile] = {
    # small and routine: behind other work, and not worth a long run
    "chore": TaskProfile(priority=25, timeout_seconds=900),
    # the defaults of the spec and the configuration
    "feature": TaskProfile(),
    # urgent: ahead of the queue, a tight deadline, and repairs to get it green
    "hotfix": TaskProfile(priority=90, timeout_seconds=600, auto_repair=2),
    # touches many files and breaks tests on the way: more time, more repairs
    "refactor": TaskProfile(timeout_seconds=3600, auto_repair=2),
}

# Each profile field and the place in the spec it fills.
FILLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("priority", ("priority",)),
    ("timeout_seconds", ("limits", "timeout_seconds")),
    ("auto_repair", ("metadata", "auto_repair")),
)


def known_profiles(config: Config) -> dict[str, TaskProfile]:
    """The built-in profiles with config's over them (a field config gives wins, one it
    leaves out or null keeps the built-in's; a type config names that is not built in is
    added)."""
    merged = dict(BUILTIN_PROFILES)
    for name, given in config.profiles.items():
        base = merged.get(name, TaskProfile())
        merged[name] = base.model_copy(update=given.model_dump(exclude_none=True))
    return merged


def task_types(config: Config) -> list[str]:
    return sorted(known_profiles(config))


def _profile(config: Config, kind: object) -> TaskProfile:
    """The profile of type ``kind``; InvalidSpec naming the known types for an unknown one."""
    profiles = known_profiles(config)
    if not isinstance(kind, str) or kind not in profiles:
        raise InvalidSpec(
            f"Unknown task type {kind!r} (metadata.type); known types: "
            f"{', '.join(sorted(profiles))} (config `profiles` adds more)."
        )
    return profiles[kind]


def apply_profile(config: Config, spec: JsonObject) -> tuple[JsonObject, AppliedProfile | None]:
    """A spec document (not validated yet) with its type's profile filling the fields it left
    unset (absent or null), and what was done: ``{"type": ..., "filled": [spec paths]}``, or
    None for a spec without a type. The caller's dict is not changed. InvalidSpec naming the
    known types for an unknown one."""
    metadata = spec.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("type") is None:
        return spec, None  # a metadata that is not an object is the spec validation's to name
    kind = metadata["type"]
    profile = _profile(config, kind)
    filled_spec = dict(spec)
    filled: list[str] = []
    for field, path in FILLS:
        value = getattr(profile, field)
        if value is not None and _fill(filled_spec, path, value):
            filled.append(".".join(path))
    return filled_spec, AppliedProfile(type=kind, filled=filled)


def fill_profile(config: Config, spec: TaskSpec) -> tuple[TaskSpec, AppliedProfile | None]:
    """apply_profile for a spec already validated: a field is unset when the caller did not
    set it (priority) or left it None (the deadline, the repairs). The profile's values are
    within the spec's bounds (TaskProfile's are the same)."""
    kind = spec.metadata.get("type")
    if kind is None:
        return spec, None
    profile = _profile(config, kind)
    filled: list[str] = []
    update: dict[str, object] = {}
    if profile.priority is not None and "priority" not in spec.model_fields_set:
        update["priority"] = profile.priority
        filled.append("priority")
    if profile.timeout_seconds is not None and spec.limits.timeout_seconds is None:
        limits = {"timeout_seconds": profile.timeout_seconds}
        update["limits"] = spec.limits.model_copy(update=limits)
        filled.append("limits.timeout_seconds")
    if profile.auto_repair is not None and spec.metadata.get("auto_repair") is None:
        update["metadata"] = {**spec.metadata, "auto_repair": profile.auto_repair}
        filled.append("metadata.auto_repair")
    return spec.model_copy(update=update), AppliedProfile(type=kind, filled=filled)


def _fill(spec: JsonObject, path: tuple[str, ...], value: Any) -> bool:
    """Set ``path`` to ``value`` when it is unset, copying each object on the way (so the
    caller's own objects are left alone); False when it is set, or when a step on the way is
    not an object (the spec's validation names that)."""
    parent = spec
    for key in path[:-1]:
        child = parent.get(key)
        if child is None:
            child = {}
        elif not isinstance(child, dict):
            return False
        parent[key] = child = dict(child)
        parent = child
    if parent.get(path[-1]) is not None:
        return False
    parent[path[-1]] = value
    return True


def without_filled(spec: JsonObject, profile: AppliedProfile | None) -> JsonObject:
    """The spec with the fields its profile filled taken out again (a retry fills them anew
    from the profile as it is then, and says so)."""
    out = dict(spec)
    for dotted in profile["filled"] if profile else []:
        *parents, last = dotted.split(".")
        parent = out
        for key in parents:
            child = parent.get(key)
            if not isinstance(child, dict):
                break
            parent[key] = child = dict(child)
            parent = child
        else:
            parent.pop(last, None)
    return out
