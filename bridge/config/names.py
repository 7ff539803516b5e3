"""The names configuration comes by, without the models: the environment variables' prefix,
the WORKER_BRIDGE_* variables that are not configuration keys and the state root. Standard
library only: the CLI's start-up gate reads the state root before anything heavy loads."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

ENV_PREFIX = "WORKER_BRIDGE_"
# WORKER_BRIDGE_* variables that are not configuration keys; any other that names no key is an
# error naming it, as an unknown key in config.yaml is (a misspelt limit must not pass silently).
OTHER_VARIABLES = {
    "MCP_TOKEN": "the MCP HTTP server's bearer token",
    "MCP_TOKEN_FILE": "a file holding that token",
    "IN_CONTAINER": "set in the bridge's own image: the same-path check is on",
    "REPOS": "the repositories folder of the compose deployment",
    "IMAGES_DIR": "image contexts to build instead of the package's own",
    "SMOKE_KEY": "the throwaway key of `images build --smoke`",
    # compose/compose.yaml's own settings, read by docker-compose from the same shell
    "VERSION": "compose: the bridge image's tag",
    "BIND": "compose: the address the port is published on",
    "PORT": "compose: the published port",
    "TOKEN_FILE": "compose: the token file given to the container as a secret",
    "SOURCE": "the bridge image's source label (a build argument)",
    # a cluster node's (bridge/pipeline/nodes.py, `worker-bridge node start`)
    "NODE_HOME": "a cluster node: the folder of worker-bridge's agent there",
    # the test suite's and CI's
    "REQUIRE_DOCKER": "tests: fail rather than skip without an engine",
    "REQUIRE_INTEROP": "tests: fail rather than skip without the TypeScript client",
    "REQUIRE_RUNSC": "tests: fail rather than skip without gVisor",
    "REQUIRE_BROWSER": "tests: fail rather than skip without chromium and Playwright",
    "REQUIRE_EROFS": "tests: fail rather than skip without mkfs.erofs (sealed views)",
    "REQUIRE_CLUSTER": "tests: fail rather than skip without the simulated cluster's tools",
    "TEST_ARTIFACTS": "tests: where the browser tests' screenshots go",
    "UPDATE_DOCS": "tests: also copy the README's screenshot into docs/",
    "TEST_BASE_IMAGE": "tests and bench: the local base image",
    "MCP_COMMAND": "the interop test's server command",
    "INTEROP_REPO": "the interop test's repository",
}


def default_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = env.get(f"{ENV_PREFIX}HOME")
    return Path(raw).expanduser().absolute() if raw else Path.home() / ".worker-bridge"


def variables(env: Mapping[str, str], keys: Collection[str]) -> Iterator[tuple[str, str | None]]:
    """(name, key) for each WORKER_BRIDGE_* variable of ``env``, sorted by name: the key it sets
    (KEY, also for a nested KEY__SUBKEY, which the key's own model checks), "" for one of
    OTHER_VARIABLES, None for one that names neither (an error, as an unknown key is)."""
    for name in sorted(env):
        rest = name.upper().removeprefix(ENV_PREFIX)
        if rest == name.upper():
            continue
        key = rest.split("__", 1)[0].lower()
        yield name, key if key in keys else "" if rest in OTHER_VARIABLES else None
