"""worker-bridge as the simulated cluster's control host (`local-cluster run -- python
bridge_driver.py ...`: in the control namespace, WORKER_BRIDGE_CLUSTER__* naming the cluster
and its registry, WORKER_BRIDGE_HOME the test's state root). Prints one JSON line after a
marker, as ray_driver.py does.

`run SPEC`: create the task of the spec file and run it here; the task's result document.
`routed SPEC`: the same with a model route `test` to an upstream this driver serves on its own
loopback (tests/support/upstream.py), its key from WB_TEST_ROUTE_KEY; also the key each
request reached the upstream with.
`compete SPEC N`: a compete of N attempts of the mock worker (its coordinator a detached
process, as always); the job's result and each candidate's task result once it ended.
`reap NODE`: the node's agent, made again if it was gone, lets go of what it holds."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bridge import WorkerBridge
from bridge.pipeline.nodes import cluster_nodes

JOB_ENDED = {"succeeded", "failed", "cancelled", "unresolved", "accepted"}
MARK = "WB-DRIVER-RESULT "


def answer(found: dict) -> None:
    print(f"\n{MARK}{json.dumps(found)}", flush=True)


ROUTE = """allow_mock_routes: true
gateway:
  routes:
    test:
      upstream: {url}
      auth: x-api-key
      key_env: WB_TEST_ROUTE_KEY
  trusted_ranges: ['127.0.0.0/8']
"""


def main() -> int:
    command, *args = sys.argv[1:]
    if command == "routed":
        from support.upstream import Upstream

        upstream = Upstream().start()
        home = Path(os.environ["WORKER_BRIDGE_HOME"])
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (home / "config.yaml").write_text(ROUTE.format(url=upstream.url))
        bridge = WorkerBridge()
        try:
            spec = json.loads(Path(args[0]).read_text())
            result = bridge.run_task(bridge.create_task(spec).task_id)
            keys = [seen.headers.get("x-api-key") for seen in upstream.requests]
            answer({"result": result.document(), "keys": keys})
        finally:
            bridge.close()
            upstream.stop()
        return 0
    bridge = WorkerBridge()
    try:
        if command == "run":
            spec = json.loads(Path(args[0]).read_text())
            task_id = bridge.create_task(spec).task_id
            result = bridge.run_task(task_id)
            answer(result.document())
        elif command == "compete":
            spec = json.loads(Path(args[0]).read_text())
            job = bridge.compete(spec, ["mock"], attempts=int(args[1]))
            deadline = time.monotonic() + 240
            while (done := bridge.job_status(job.job_id)).status not in JOB_ENDED:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            tasks = [bridge.get_task(c["task_id"]).document() for c in done.candidates]
            answer({"job": done.model_dump(mode="json"), "tasks": tasks})
        elif command == "reap":  # the node's agent made again (it reaps as it starts)
            nodes = cluster_nodes(bridge.config.cluster)
            answer({"reaped": nodes.agent(args[0]).reap()})
    finally:
        bridge.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
