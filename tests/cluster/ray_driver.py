"""A Ray driver the cluster tests run as the control host (`local-cluster run -- python
ray_driver.py ...`, in the control namespace with RAY_ADDRESS and the token's file set); it
prints one JSON line after a marker (Ray's own messages may share stdout, unterminated).

`where NODE...`: a task pinned to each node (by the resource naming it, `max_retries=0`) says
where it ran: its network namespace, node IP, Ray node and the Docker engine it reaches.
`crash NODE PATH`: a task pinned to NODE writes a line to PATH and kills its own worker; with
`max_retries=0` Ray reports the crash and never runs it again."""

from __future__ import annotations

import json
import os
import sys

import ray

MARK = "WB-DRIVER-RESULT "


def where() -> dict:
    import docker

    client = docker.from_env()
    try:
        info = client.info()
    finally:
        client.close()
    return {
        "netns": os.stat("/proc/self/ns/net").st_ino,
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "docker_host": os.environ.get("DOCKER_HOST"),
        "docker_root": info["DockerRootDir"],
    }


def crash(path: str) -> None:
    with open(path, "a") as out:
        out.write("ran\n")
    os._exit(1)


def answer(found: dict) -> None:
    print(f"\n{MARK}{json.dumps(found)}", flush=True)


def main() -> int:
    command, *args = sys.argv[1:]
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    if command == "where":
        remote = ray.remote(max_retries=0, num_cpus=0)(where)
        calls = {n: remote.options(resources={f"wb_node:{n}": 0.01}).remote() for n in args}
        found = {node: ray.get(ref, timeout=60) for node, ref in calls.items()}
        nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        answer({"where": found, "nodes": nodes})
    elif command == "crash":
        node, path = args
        remote = ray.remote(max_retries=0, num_cpus=0)(crash)
        try:
            ray.get(remote.options(resources={f"wb_node:{node}": 0.01}).remote(path), timeout=60)
            outcome = "returned"
        except ray.exceptions.WorkerCrashedError:
            outcome = "WorkerCrashedError"
        except ray.exceptions.RayError as exc:
            outcome = type(exc).__name__
        answer({"outcome": outcome})
    return 0


if __name__ == "__main__":
    sys.exit(main())
