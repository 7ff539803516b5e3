"""The images a devcontainer's Dockerfile builds from: every `FROM`, `COPY --from=` and
`RUN --mount=...,from=` that names an image rather than an earlier stage, with the Dockerfile's
global `ARG` defaults and `build.args` put in. The repository's Dockerfile is the caller's to
choose (any `base_ref`), so these are images the spec names, and each must be allowed
(bridge/scope.py); a reference that still holds a variable after that cannot be checked and is
refused."""

from __future__ import annotations

import re

from bridge.errors import InvalidSpec

_VARIABLE = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-+][^}]*)?\}|([A-Za-z_][A-Za-z0-9_]*))"
)
_FROM_OPTION = re.compile(r"^--from=(\S+)$")
_MOUNT_FROM = re.compile(r"^--mount=\S*?\bfrom=([^,\s]+)")


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per logical line: comments dropped, continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    if pending.strip():
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _expand(value: str, args: dict[str, str], where: str) -> str:
    def put(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in args or args[name] == "":
            raise InvalidSpec(
                f"{where} names an image through ${name}, which has no value there; write the "
                "image out (or give it an ARG default) so it can be checked."
            )
        return args[name]

    return _VARIABLE.sub(put, value)


def dockerfile_images(text: str, build_args: dict[str, str], where: str) -> list[str]:
    """The images ``text`` builds from, in order (``where`` names the file in errors)."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []
    seen_from = False

    def image(ref: str) -> None:
        ref = _expand(ref, args, where)
        if ref.lower() not in stages and ref.lower() != "scratch" and not ref.isdigit():
            images.append(ref)

    for word, rest in _instructions(text):
        if word == "ARG" and not seen_from:
            for item in rest.split():
                name, _, default = item.partition("=")
                args[name] = build_args.get(name, default.strip("\"'"))
        elif word == "FROM":
            seen_from = True
            parts = [p for p in rest.split() if not p.startswith("--")]
            if not parts:
                raise InvalidSpec(f"{where} has a FROM that names no image.")
            image(parts[0])
            if len(parts) >= 3 and parts[1].upper() == "AS":
                stages.add(parts[2].lower())
        elif word in ("COPY", "ADD", "RUN"):
            options = []  # the instruction's own flags come first; the rest is its command
            for token in rest.split():
                if not token.startswith("--"):
                    break
                options.append(token)
            for token in options:
                for ref in _FROM_OPTION.findall(token) + _MOUNT_FROM.findall(token):
                    image(ref)
    return images
