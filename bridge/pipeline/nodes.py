"""The control host's view of the cluster's nodes: which are alive with how many slots, and a
link to each one's agent (bridge/pipeline/node_agent.py). Two kinds: `RayNodes`, the agents as Ray
actors, one per node, pinned to it by the resource naming it (`wb_node:NAME`); and
`LocalNodes`, agents in this process (the fast tests, without an engine or Ray). The pipeline
sees only `Nodes` and `AgentLink`.

Ray's own retries are off everywhere (`max_restarts=0`, `max_task_retries=0`): whether a turn
runs again is worker-bridge's decision. Ray is imported here only, when a cluster is
configured: a one-host install does not need it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from bridge.cluster.link import (
    NODE_RESOURCE,
    SLOT_RESOURCE,
    AgentLink,
    NodeInfo,
    NodeLost,
    node_root,
)
from bridge.cluster.orders import ChecksOrder, TurnOrder, Update
from bridge.config.sections import ClusterConfig
from bridge.errors import BridgeError
from bridge.pipeline.node_agent import NodeAgent

CALL_TIMEOUT_S = 30.0
IMAGE_LOAD_S = 600.0  # a streamed image read into the node's engine


# -- agents in this process (tests) ------------------------------------------------------------


class _LocalLink:
    """A NodeAgent called directly; ``down`` makes it behave as a lost node (tests)."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent
        self.down = threading.Event()

    def _check(self) -> None:
        if self.down.is_set():
            raise NodeLost(self.agent.name, f"Node {self.agent.name} does not answer.")

    def missing(self, repo_key: str, commits: list[str]) -> list[str]:
        self._check()
        return self.agent.missing(repo_key, commits)

    def touch(self, task_id: str) -> str:
        self._check()
        return self.agent.touch(task_id)

    def cancel(self, task_id: str) -> None:
        self._check()
        self.agent.cancel(task_id)

    def release(self, task_id: str) -> None:
        self._check()
        self.agent.release(task_id)

    def reap(self) -> list[str]:
        self._check()
        return self.agent.reap()

    def images(self) -> list[str]:
        self._check()
        return self.agent.images()

    def has_image(self, reference: str, image_id: str) -> bool:
        self._check()
        return self.agent.has_image(reference, image_id)

    def image_part(self, upload: str, index: int, data: bytes) -> None:
        self._check()
        self.agent.image_part(upload, index, data)

    def image_done(self, upload: str, reference: str, image_id: str) -> None:
        self._check()
        self.agent.image_done(upload, reference, image_id)

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        return self._stream(self.agent.run_turn(order, timeout_s))

    def run_checks(self, order: ChecksOrder, timeout_s: float) -> Iterator[Update]:
        return self._stream(self.agent.run_checks(order, timeout_s))

    def _stream(self, updates: Iterator[Update]) -> Iterator[Update]:
        self._check()
        for update in updates:
            if self.down.is_set():  # a lost node says nothing more; its turn goes on there
                raise NodeLost(self.agent.name, f"Node {self.agent.name} stopped answering.")
            yield update


class LocalNodes:
    """Node agents in this process, each with its own state root and sandbox."""

    def __init__(self, agents: list[NodeAgent], slots: int = 2) -> None:
        self.links = {agent.name: _LocalLink(agent) for agent in agents}
        self.slots = slots

    def nodes(self) -> list[NodeInfo]:
        return [
            NodeInfo(name, "in-process", not link.down.is_set(), self.slots)
            for name, link in self.links.items()
        ]

    def agent(self, node: str) -> AgentLink:
        return self.links[node]

    def relay_host(self) -> str:
        return "127.0.0.1"


# -- agents as Ray actors ----------------------------------------------------------------------


class _AgentActor(NodeAgent):
    """The node's agent as a Ray actor: made on its node, against the engine its node process
    names (DOCKER_HOST), with the node's state root. A new one reaps what an earlier one left
    (its node went down), and says so with the first `reap`."""

    def __init__(self, name: str) -> None:
        from bridge.sandbox.docker import DockerSandbox

        super().__init__(name, node_root(name), DockerSandbox())
        self._reaped = super().reap()

    def reap(self) -> list[str]:
        reaped, self._reaped = self._reaped, []
        return reaped + super().reap()


class _RayLink:
    def __init__(self, ray: Any, actor: Any, node: str, timeout_s: float) -> None:
        self.ray, self.actor, self.node, self.timeout_s = ray, actor, node, timeout_s

    def _get(self, ref: Any, timeout: float | None = None) -> Any:
        try:
            return self.ray.get(ref, timeout=timeout or min(CALL_TIMEOUT_S, self.timeout_s))
        except BridgeError:
            raise
        except self.ray.exceptions.RayTaskError as exc:  # the agent answered: with an error
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BridgeError):
                raise cause from exc
            raise BridgeError(
                f"Node {self.node}'s agent failed ({str(cause or exc)[:300]}).", kind="cluster"
            ) from exc
        except Exception as exc:  # noqa: BLE001 - GetTimeoutError, ActorDiedError, NodeDiedError...
            raise NodeLost(
                self.node,
                f"Node {self.node} did not answer ({exc.__class__.__name__}).",
            ) from exc

    def missing(self, repo_key: str, commits: list[str]) -> list[str]:
        return list(self._get(self.actor.missing.remote(repo_key, commits)))

    def touch(self, task_id: str) -> str:
        return str(self._get(self.actor.touch.remote(task_id)))

    def cancel(self, task_id: str) -> None:
        self._get(self.actor.cancel.remote(task_id))

    def release(self, task_id: str) -> None:
        self._get(self.actor.release.remote(task_id))

    def reap(self) -> list[str]:
        return list(self._get(self.actor.reap.remote()))

    def images(self) -> list[str]:
        return list(self._get(self.actor.images.remote()))

    def has_image(self, reference: str, image_id: str) -> bool:
        return bool(self._get(self.actor.has_image.remote(reference, image_id)))

    def image_part(self, upload: str, index: int, data: bytes) -> None:
        self._get(self.actor.image_part.remote(upload, index, data))

    def image_done(self, upload: str, reference: str, image_id: str) -> None:
        self._get(self.actor.image_done.remote(upload, reference, image_id), IMAGE_LOAD_S)

    def run_turn(self, order: TurnOrder, timeout_s: float) -> Iterator[Update]:
        return self._stream(self.actor.run_turn, order, timeout_s)

    def run_checks(self, order: ChecksOrder, timeout_s: float) -> Iterator[Update]:
        return self._stream(self.actor.run_checks, order, timeout_s)

    def _stream(self, method: Any, order: object, timeout_s: float) -> Iterator[Update]:
        stream = method.options(num_returns="streaming").remote(order, timeout_s)
        while True:
            ready, _ = self.ray.wait([stream], timeout=timeout_s)
            if not ready:
                raise NodeLost(
                    self.node, f"Node {self.node} said nothing for {timeout_s:g} s: it is lost."
                )
            try:
                ref = next(stream)
            except StopIteration:
                return
            yield self._get(ref, timeout_s)


class RayNodes:
    """The nodes of the Ray cluster at ``config.address`` (this process joins it as a driver
    on first use)."""

    _joined: dict[str, Any] = {}
    _lock = threading.Lock()

    def __init__(self, config: ClusterConfig) -> None:
        if not config.address:
            raise BridgeError("No cluster is configured (cluster.address).", kind="cluster")
        self.config = config
        self.ray = self._join(config)
        self._actor_class = self.ray.remote(_AgentActor)

    @classmethod
    def _join(cls, config: ClusterConfig) -> Any:
        try:
            import ray
        except ImportError as exc:
            raise BridgeError(
                "cluster.address is set but Ray is not installed; install worker-bridge's "
                "`cluster` extra (pip install 'worker-bridge[cluster]').",
                kind="cluster",
            ) from exc
        with cls._lock:
            if not ray.is_initialized():
                try:
                    ray.init(
                        address=config.address,
                        namespace=config.namespace,
                        logging_level=logging.ERROR,
                        log_to_driver=False,
                        configure_logging=False,
                    )
                except Exception as exc:  # noqa: BLE001 - ConnectionError, auth refused...
                    raise BridgeError(
                        f"The Ray cluster at {config.address} could not be joined "
                        f"({exc.__class__.__name__}: {str(exc)[:200]}); check cluster.address "
                        "and that RAY_AUTH_TOKEN_PATH names the cluster's token.",
                        kind="cluster",
                    ) from exc
        return ray

    def nodes(self) -> list[NodeInfo]:
        """The cluster's nodes by name: an alive one by the resource naming it; a dead one (Ray
        lists it without resources) by its node name, unless the name is alive again."""
        found: dict[str, NodeInfo] = {}
        for node in self.ray.nodes():
            resources = node.get("Resources") or {}
            names = [k[len(NODE_RESOURCE) :] for k in resources if k.startswith(NODE_RESOURCE)]
            alive = bool(node.get("Alive"))
            if not names and not alive and node.get("NodeName"):
                names = [str(node["NodeName"])]
            for name in names:
                if name not in found or alive:
                    address = str(node.get("NodeManagerAddress", ""))
                    slots = int(resources.get(SLOT_RESOURCE, 1))
                    found[name] = NodeInfo(name, address, alive, slots)
        return sorted(found.values(), key=lambda n: n.name)

    def agent(self, node: str) -> AgentLink:
        actor = self._actor_class.options(
            name=f"wb-agent-{node}",
            namespace=self.config.namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            resources={f"{NODE_RESOURCE}{node}": 0.001},
            max_concurrency=64,
            max_restarts=0,
            max_task_retries=0,
        ).remote(node)
        return _RayLink(self.ray, actor, node, self.config.node_timeout_s)

    def relay_host(self) -> str:
        return self.config.relay_host or str(self.ray.util.get_node_ip_address())


def cluster_nodes(config: ClusterConfig) -> RayNodes:
    """The nodes of the configured cluster (this process joins it once)."""
    return RayNodes(config)
