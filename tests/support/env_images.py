"""The project images the environment tests run in, built once per engine (kept by tag).

`worker-bridge-test/env-node` is a plain Debian with Node.js, npm, python3, pip and pytest, and
nothing of worker-bridge (no socat, no relay, no CLI): what a user's own CI image would be.
`worker-bridge-test/env-busybox` has a static busybox and no C library at all."""

from __future__ import annotations

import io
import tarfile

NODE_IMAGE = "worker-bridge-test/env-node:1"
NODE_DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update \\
 && apt-get install -y --no-install-recommends nodejs npm python3 python3-pip python3-pytest \\
 && rm -rf /var/lib/apt/lists/*
"""
BUSYBOX_IMAGE = "worker-bridge-test/env-busybox:1"


def context(files: dict[str, bytes | str]) -> bytes:
    """A tar build context holding ``files``."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        for name, content in files.items():
            raw = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(raw), 0o755
            archive.addfile(info, io.BytesIO(raw))
    return data.getvalue()


def _built(sandbox, tag: str, dockerfile: str, base_image: str) -> str:
    """TAG, built from DOCKERFILE on BASE_IMAGE when the engine does not have it yet."""
    if not sandbox.image_present(tag):
        sandbox.build_image(
            tag,
            context({"Dockerfile": dockerfile}),
            buildargs={"BASE_IMAGE": base_image},
            labels={"io.worker-bridge.test": "environments"},
            on_line=lambda _line: None,
        )
    return tag


def node_image(sandbox, base_image: str) -> str:
    return _built(sandbox, NODE_IMAGE, NODE_DOCKERFILE, base_image)


BUSYBOX_DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS get
RUN apt-get update && apt-get install -y --no-install-recommends busybox-static
FROM scratch
COPY --from=get /bin/busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
"""


def busybox_image(sandbox, base_image: str) -> str:
    return _built(sandbox, BUSYBOX_IMAGE, BUSYBOX_DOCKERFILE, base_image)
