"""`worker-bridge ui`: the local web view (bridge/ui), served until interrupted."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # parsing `worker-bridge --help` loads neither the facade nor the web stack
    from bridge.service import WorkerBridge


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="where to listen (default 127.0.0.1:8770)"
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="file holding the token to sign in with (default: the MCP server's token "
        "variables, else one made for this run and printed; the link printed signs in once)",
    )
    parser.add_argument(
        "--no-token", action="store_true", help="sign in without a token; only on loopback"
    )


def cmd_ui(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    from bridge.ui.serve import serve, ui_options

    options = ui_options(args)  # ConfigError (exit 2) before anything is served
    return serve(bridge, options, bridge.config.http)
