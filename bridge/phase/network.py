"""The worker container's way out: when the task's worker uses model routes, or the task asks
for `network: {mode: allowlist}`, its gateway (bridge/gateway) is started on the host before the
container and stopped after it; the container gets the gateway's folder mounted at
/run/worker-bridge, the relay in front of its command, and the endpoints in its environment.
Verification containers never get one. The gateway module (and aiohttp) load only here."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from bridge.gateway.policy import resolve_routes
from bridge.phase.handle import PhaseHandle
from bridge.sandbox import ContainerSpec, Mount

if TYPE_CHECKING:
    from bridge.gateway.proxy import Asker
    from bridge.gateway.server import Gateway

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
    """The names the worker's proxy lets through: network.domains (with `allowlist`) and the
    names approved for this task; None: it refuses everything."""
    network = handle.spec.network
    listed = [d.lower().rstrip(".") for d in network.domains] if network.mode == "allowlist" else []
    if not asks(handle):
        return listed if network.mode == "allowlist" else None
    approved = handle.ctx.store.requests.approved(handle.task_id, "network")
    return listed + [str(r.detail.get("host", "")) for r in approved if r.detail.get("host")]


def network_asker(handle: PhaseHandle) -> Asker:
    """What the proxy asks on refusing a public name off the list: the store's request for it
    (raised on the first attempt, an attempt counted on each later one). The store is the
    truth, so an approval given by any process lets the next attempt through."""
    store, task_id = handle.ctx.store, handle.task_id
    turn = handle.record.turn
    timeout = handle.limits.input_timeout_seconds
    most = handle.ctx.config.gateway.max_requests

    def ask(host: str, port: int) -> tuple[str, str | None]:
        return store.requests.network_attempt(
            task_id,
            host.lower().rstrip("."),
            port,
            turn=turn,
            expires_at=time.time() + timeout,
            max_requests=most,
        )

    return ask


@contextmanager
def task_gateway(handle: PhaseHandle, routes: list[str]) -> Iterator[Gateway | None]:
    """The worker's gateway while the block runs (None when the task needs none); its usage is
    added to the task's when it stops."""
    if not needs_gateway(handle, routes):
        yield None
        return
    allowlist = task_allowlist(handle)
    asker = network_asker(handle) if asks(handle) else None
    with open_gateway(handle, routes, allowlist, handle.task_id, asker=asker) as gateway:
        yield gateway


@contextmanager
def open_gateway(
    handle: PhaseHandle,
    routes: list[str],
    allowlist: list[str] | None,
    name: str,
    *,
    owner: tuple[int, int] | None | bool = True,
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
    if owner is True:
        _, owner = ctx.sandbox_identity()
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
        owner,
        recorded_events=recorded,
        asker=asker,
    ).start()
    try:
        yield gateway
    finally:
        gateway.stop()
        usage = gateway.usage
        recorded = handle.ctx.store.load_task(handle.task_id).usage
        usage.merge(recorded)
        handle.update(usage=usage.document())


def with_gateway(
    spec: ContainerSpec, handle: PhaseHandle, gateway: Gateway | None, *, no_proxy: bool = True
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
