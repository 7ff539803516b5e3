"""The MCP server's transport flags (`--http`, `--token-file`, `--no-token`), shared by
`worker-bridge-mcp` and `worker-bridge mcp`, and the names they mention. Kept apart from
bridge/mcp/http.py so that building the CLI's parser (every `worker-bridge` command, `--help`
included) does not load uvicorn and the HTTP listener."""

from __future__ import annotations

import argparse

TOKEN_ENV = "WORKER_BRIDGE_MCP_TOKEN"
TOKEN_FILE_ENV = "WORKER_BRIDGE_MCP_TOKEN_FILE"
MCP_PATH = "/mcp"
HEALTH_PATH = "/healthz"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The transport flags, shared by `worker-bridge-mcp` and `worker-bridge mcp`."""
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help=f"serve streamable HTTP at http://HOST:PORT{MCP_PATH} instead of stdio "
        f"(health check: GET {HEALTH_PATH})",
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help=f"file holding the bearer token clients must send (default: ${TOKEN_FILE_ENV}, "
        f"else the token itself in ${TOKEN_ENV})",
    )
    parser.add_argument(
        "--no-token",
        action="store_true",
        help="serve without a token; allowed only on loopback (127.0.0.1, ::1, localhost)",
    )
