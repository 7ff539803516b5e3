"""Run by the virtualenv's Python inside the control namespace (Ray is not imported by the
script itself): the nodes the Ray head knows, as JSON on stdout, read from the GCS without
joining the cluster as a driver. With --wait NAMES, it first waits until each named node is
alive (bounded by --timeout)."""

from __future__ import annotations

import argparse
import json
import sys
import time


def nodes(address: str) -> list[dict]:
    from ray._raylet import GcsClient

    client = GcsClient(address=address)
    found = []
    for info in client.get_all_node_info(timeout=5).values():
        found.append(
            {
                "id": info.node_id.hex(),
                "name": info.node_name,
                "ip": info.node_manager_address,
                "alive": info.state == 0,  # GcsNodeInfo.ALIVE
                "resources": dict(info.resources_total),
            }
        )
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--wait", default="")
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args()
    wanted = {n for n in args.wait.split(",") if n}
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            found = nodes(args.address)
        except Exception as exc:  # the head not answering yet is what we wait through
            found, error = [], f"{exc.__class__.__name__}: {exc}"
        else:
            error = ""
        alive = {n["name"] for n in found if n["alive"]}
        if wanted <= alive and not error or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    print(json.dumps({"nodes": found, "error": error, "missing": sorted(wanted - alive)}))
    return 0 if wanted <= alive and not error else 1


if __name__ == "__main__":
    sys.exit(main())
