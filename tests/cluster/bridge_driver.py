"""worker-bridge as the simulated cluster's control host (`local-cluster run -- python
bridge_driver.py ...`: in the control namespace, WORKER_BRIDGE_CLUSTER__* naming the cluster
and its registry, WORKER_BRIDGE_HOME the test's state root). Prints one JSON line after a
marker, as ray_driver.py does.

`run SPEC`: create the task of the spec file and run it here; the task's result document.
`routed SPEC`: the same with a model route `test` to an upstream this driver serves on its own
loopback (tests/support/upstream.py), its key from WB_TEST_ROUTE_KEY; also the key each
request reached the upstream with, and what the relay hub answered, after the task, to each of
its turns' secrets presented from the worker's node (WB_TEST_NETNS: node name to namespace).
`compete SPEC N`: a compete of N attempts of the mock worker (its coordinator a detached
process, as always); the job's result and each candidate's task result once it ended.
`reap NODE`: the node's agent, made again if it was gone, lets go of what it holds."""

from __future__ import annotations

import json
import os
import subprocess
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
        turns = _recording_secrets()
        home = Path(os.environ["WORKER_BRIDGE_HOME"])
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (home / "config.yaml").write_text(ROUTE.format(url=upstream.url))
        bridge = WorkerBridge()
        try:
            spec = json.loads(Path(args[0]).read_text())
            result = bridge.run_task(bridge.create_task(spec).task_id)
            keys = [seen.headers.get("x-api-key") for seen in upstream.requests]
            netns = json.loads(os.environ["WB_TEST_NETNS"])[result.worker_node or ""]
            after = [_presented(netns, address, secret) for address, secret in turns]
            answer({"result": result.document(), "keys": keys, "after": after})
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


def _recording_secrets() -> list:
    """(hub address, secret) of each turn the relay hubs of this process open from now on."""
    from bridge.cluster.relay import RelayHub

    opened: list = []
    open_turn = RelayHub.open_turn

    def recorded(hub: RelayHub, folder: Path) -> str:
        secret = open_turn(hub, folder)
        opened.append((hub.address, secret))
        return secret

    RelayHub.open_turn = recorded  # type: ignore[method-assign]
    return opened


PRESENT = """
import socket, sys
host, port, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with socket.create_connection((host, port), timeout=10) as conn:
    conn.sendall(b"WBRELAY1 " + secret.encode() + b" routes\\n")
    try:
        said = conn.recv(64)
    except ConnectionResetError:
        said = b""
print(said.decode(errors="replace"), end="")
"""


def _presented(netns: str, address: tuple, secret: str) -> dict:
    """What the hub at ``address`` answers ``secret`` from inside the node's namespace."""
    argv = ["nsenter", f"--net=/run/netns/{netns}", sys.executable, "-c", PRESENT]
    done = subprocess.run(
        [*argv, address[0], str(address[1]), secret], capture_output=True, text=True, timeout=30
    )
    return {"code": done.returncode, "said": done.stdout, "error": done.stderr[-500:]}


if __name__ == "__main__":
    sys.exit(main())
