"""The worker container's way out: when the task's worker uses model routes, or the task asks
for `network: {mode: allowlist}`, its gateway (bridge/gateway) is started on the host before the
container and stopped after it; the container gets the gateway's folder mounted at
/run/worker-bridge, the relay in front of its command, and the endpoints in its environment.
Verification containers never get one. The gateway module (and aiohttp) load only here."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from bridge.asking import listed_domains
from bridge.gateway.policy import resolve_routes
from bridge.phase.handle import PhaseHandle
from bridge.sandbox import ContainerSpec, Mount

if TYPE_CHECKING:
    from bridge.config.sections import GatewayConfig
    from bridge.gateway.proxy import Asker
    from bridge.gateway.server import Gateway
    from bridge.store import Store

CONTAINER_GATEWAY = "/run/worker-bridge"
RELAY = "/opt/worker-bridge/bin/wb-relay"  # in every worker image's bundle (environments/bundle.py)
ROUTES_URL = "http://127.0.0.1:7800"
PROXY_URL = "http://127.0.0.1:7801"


def asks(handle: PhaseHandle) -> bool:
    """Whether a refused name becomes a request (`network.on_refused: ask`, or config's)."""
    chosen = handle.spec.network.on_refused or handle.ctx.config.gateway.on_refused
    return chosen == "ask"


def needs_gateway(handle: PhaseHandle, routes: list[str]) -> bool:
    return bool(routes) or handle.spec.network.mode == "allowlist" or asks(handle)


def task_allowlist(handle: PhaseHandle) -> list[str] | None:
    """The patterns the worker's proxy lets through: network.domains (with `allowlist`); None:
    it refuses everything (`none`, not asking). Approved names are not patterns: the proxy
    learns each approved (name, port) from its asker (see NetworkAsker)."""
    return listed_domains(handle.spec, asking=asks(handle))


class GatewayPort(Protocol):
    """What a worker container is fitted with: the folder holding the gateway's two sockets,
    the model routes behind them, and the gateway's bounds. The gateway itself on one host; on
    a node, the relay's folder that carries each connection to it (bridge/cluster/relay.py)."""

    @property
    def folder(self) -> Path: ...

    @property
    def routes(self) -> Iterable[str]: ...

    @property
    def config(self) -> GatewayConfig: ...


# A worker turn's way to its gateway: (handle, routes, turn) -> the port while the block runs.
GatewayOpener = Callable[
    [PhaseHandle, list[str], int], AbstractContextManager["GatewayPort | None"]
]


# How long the gateway trusts what it last read of a pending request before asking the store
# again: an approval given by another process is seen within this (docs/asking.md).
PENDING_TTL_S = 1.0


class NetworkAsker:
    """What the proxy asks on refusing a name off the list (nothing resolved yet): the store's
    request for it (raised on the first attempt, later attempts counted). The store is the
    truth, so an approval given by any process lets an attempt through within PENDING_TTL_S;
    a settled answer (approved, denied, expired) is final and kept here, and a pending one for
    PENDING_TTL_S, with the attempts made meanwhile written in one go (a storm of attempts is
    not a storm of writes). Only names with a request are kept (at most max_requests): past
    that, or once the task ended, every new name is refused without asking. A name redaction
    would change (a secret in it) raises no request and is kept nowhere: a plain refusal. An
    approval that lets an attempt through has reached the worker: it is marked delivered with
    this turn (no later turn is resumed for it)."""

    def __init__(
        self,
        store: Store,
        task_id: str,
        turn: int,
        *,
        redact: Callable[[str], str],
        max_requests: int,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.task_id, self.turn = store, task_id, turn
        self.redact, self.max_requests, self.timeout_s = redact, max_requests, timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._known: dict[tuple[str, int], tuple[str, str | None, float]] = {}
        self._uncounted: dict[tuple[str, int], int] = {}
        # "over" (max_requests reached) or "ended": a new name is refused without asking
        self._ended: str | None = None

    @classmethod
    def of(cls, handle: PhaseHandle, turn: int) -> NetworkAsker:
        return cls(
            handle.ctx.store,
            handle.task_id,
            turn,
            redact=handle.redactor.redact,
            max_requests=handle.ctx.config.gateway.max_requests,
            timeout_s=handle.limits.input_timeout_seconds,
        )

    def __call__(self, host: str, port: int) -> tuple[str, str | None]:
        key = (host, port)
        with self._lock:
            known = self._known.get(key)
            now = self.clock()
            if known is not None and (known[0] != "pending" or now - known[2] < PENDING_TTL_S):
                if known[0] == "pending":
                    self._uncounted[key] = self._uncounted.get(key, 0) + 1
                return known[0], known[1]
            if known is None and self._ended is not None:  # no store, no memory per name
                return self._ended, None
            if self.redact(host) != host:  # kept nowhere: the worker can make endless ones
                return "withheld: it looks like a secret", None
            found = self.store.requests.network_attempt(
                self.task_id,
                host,
                port,
                turn=self.turn,
                expires_at=time.time() + self.timeout_s,
                max_requests=self.max_requests,
                attempts=1 + self._uncounted.pop(key, 0),
            )
            if found[1] is None:  # over max_requests, or the task ended: so for every new name
                self._ended = found[0]
                return found
            if found[0] == "approved":
                self.store.requests.mark_delivered([found[1]], self.turn)
            self._known[key] = (*found, now)  # at most max_requests entries: each has a request
            return found

    def flush(self) -> None:
        """Write the attempts counted here but not yet in the store (the gateway stopped)."""
        with self._lock:
            uncounted, self._uncounted = self._uncounted, {}
        for (host, port), n in uncounted.items():
            self.store.requests.count_attempts(self.task_id, host, port, n)


@contextmanager
def task_gateway(handle: PhaseHandle, routes: list[str], turn: int) -> Iterator[Gateway | None]:
    """The worker's gateway for ``turn`` while the block runs (None when the task needs none);
    its usage is added to the task's when it stops."""
    if not needs_gateway(handle, routes):
        yield None
        return
    allowlist = task_allowlist(handle)
    asker = NetworkAsker.of(handle, turn) if asks(handle) else None
    try:
        with open_gateway(handle, routes, allowlist, handle.task_id, asker=asker) as gateway:
            yield gateway
    finally:
        if asker is not None:
            asker.flush()


@contextmanager
def open_gateway(
    handle: PhaseHandle,
    routes: list[str],
    allowlist: list[str] | None,
    name: str,
    *,
    owner: tuple[int, int] | None | Literal[True] = True,
    setup: bool = False,
    asker: Asker | None = None,
) -> Iterator[Gateway]:
    """A gateway with these model ``routes`` and proxy ``allowlist`` (None: the proxy refuses
    everything), in `<home>/gateways/<name>`, while the block runs; its sockets belong to
    ``owner`` (True: the sandbox identity; None: the bridge's own user). ``setup``: a setup's
    gateway, with `setup_max_connections` as its bound."""
    from bridge.gateway.server import Gateway

    ctx = handle.ctx
    resolved = resolve_routes(ctx.config, routes)
    for route in resolved.values():
        if route.key:
            handle.redactor.add_secret(route.key)  # should it ever show up, it is masked
    sockets_owner = ctx.sandbox_identity()[1] if owner is True else owner
    config = ctx.config.gateway
    if setup:
        config = config.model_copy(update={"max_connections": config.setup_max_connections})
        _enough_descriptors(2 * config.max_connections + 256)  # each is two sockets
    # gateway.max_events bounds the task's network events, whichever gateway (turn, setup,
    # adopting runner) records them: a new one starts from what the task already has.
    recorded = sum(
        ctx.store.count_events(handle.task_id, kind)
        for kind in ("network.request", "network.refused")
    )
    gateway = Gateway(
        ctx.home / "gateways" / name,
        resolved,
        allowlist,
        config,
        handle.emit,
        sockets_owner,
        recorded_events=recorded,
        asker=asker,
    ).start()
    # Its folder goes with it, unless the block leaves a container running to be adopted (an
    # interrupt, a lost claim: as run_container decides), which is bound to that folder and
    # will reach the adopting runner's gateway there; prune removes what stays.
    left_running = True
    try:
        yield gateway
        left_running = False
    except Exception:
        left_running = False
        raise
    finally:
        gateway.stop(keep_folder=left_running or handle.lost())
        usage = gateway.usage
        usage.merge(handle.ctx.store.load_task(handle.task_id).usage)
        handle.update(usage=usage.document())


def with_gateway(
    spec: ContainerSpec, handle: PhaseHandle, gateway: GatewayPort | None, *, no_proxy: bool = True
) -> ContainerSpec:
    """A container spec fitted with the gateway (unchanged when there is none). ``no_proxy``
    off: requests to localhost go through the proxy too (a setup's registry may be a name
    of the host's loopback, which only the gateway can reach)."""
    if gateway is None:
        return spec
    env = dict(spec.env)
    env["WB_GATEWAY_URL"] = ROUTES_URL
    for name in gateway.routes:
        env[f"WB_ROUTE_{name.upper().replace('-', '_')}"] = f"{ROUTES_URL}/{name}"
    # The proxy answers whatever the network mode: with `none` it refuses every request, so
    # what a worker tries to reach besides its routes is logged (`network.refused`), not lost.
    for key in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        env[key] = PROXY_URL
    if no_proxy:
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    # The relay's forked connections per port (wb-relay): no more than the gateway takes at
    # once, and a quarter of the container's processes, so a burst cannot use them all up.
    children = max(1, min(gateway.config.max_connections, spec.pids // 4))
    env["WB_RELAY_MAX_CHILDREN"] = str(children)
    return replace(
        spec,
        command=[RELAY, *spec.command],
        env=env,
        mounts=[*spec.mounts, Mount(gateway.folder, CONTAINER_GATEWAY, read_only=True)],
    )


def _enough_descriptors(wanted: int) -> None:
    """Raise this process's soft limit on open files towards ``wanted`` (up to the hard one)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
