"""worker-bridge as the simulated cluster's control host (`local-cluster run -- python
bridge_driver.py ...`: in the control namespace, WORKER_BRIDGE_CLUSTER__* naming the cluster
and its registry, WORKER_BRIDGE_HOME the test's state root). Prints one JSON line after a
marker, as ray_driver.py does.

`run SPEC`: create the task of the spec file and run it here; the task's result document.
`start SPEC`: create it and run it in a thread; print its id at once, then the result."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bridge import WorkerBridge
from bridge.pipeline.nodes import cluster_nodes

MARK = "WB-DRIVER-RESULT "


def answer(found: dict) -> None:
    print(f"\n{MARK}{json.dumps(found)}", flush=True)


def main() -> int:
    command, *args = sys.argv[1:]
    bridge = WorkerBridge()
    try:
        if command == "run":
            spec = json.loads(Path(args[0]).read_text())
            task_id = bridge.create_task(spec).task_id
            result = bridge.run_task(task_id)
            answer(result.document())
        elif command == "reap":  # the node's agent made again (it reaps as it starts)
            nodes = cluster_nodes(bridge.config.cluster)
            answer({"reaped": nodes.agent(args[0]).reap()})
    finally:
        bridge.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
