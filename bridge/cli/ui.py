"""`worker-bridge ui`: the local web view (bridge/ui), served until interrupted."""

from __future__ import annotations

import argparse

from bridge.service import WorkerBridge


def cmd_ui(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    from bridge.ui.serve import serve, ui_options

    options = ui_options(args)  # ConfigError (exit 2) before anything is served
    return serve(bridge, options, bridge.config.http)
