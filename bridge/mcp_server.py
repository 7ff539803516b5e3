"""The stdio MCP server (`worker-bridge-mcp`). Not built yet: it lands with its own issue."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print(
        "worker-bridge: the MCP server is not available in this version yet; "
        "use the `worker-bridge` CLI or the Python library.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
