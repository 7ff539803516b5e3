"""The allowlist proxy: CONNECT tunnels (HTTPS) and absolute-URI requests (HTTP) to names the
task lists, on allowed ports, at addresses resolved here and checked on every connection (a
listed name that resolves to a loopback, private, link-local or metadata address is refused
unless config trusts that range). A tunnel holds no budget while it is idle: each read, in
either direction, takes a share of the gateway's byte budget until it is passed on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
import h11

from bridge.config.settings import GatewayConfig
from bridge.events import Destination
from bridge.gateway.accounting import Accounting
from bridge.gateway.budget import ByteBudget
from bridge.gateway.conn import Conn, connect_tcp
from bridge.gateway.exchange import HOP_BY_HOP, READ, Exchange, Refused, content_length, shown
from bridge.gateway.policy import (
    address_refusal,
    name_allowed,
    request_refusal,
    resolve,
    resolve_approved,
)
from bridge.gateway.upstream import Outgoing, stream

_HOP = HOP_BY_HOP | {b"proxy-authorization"}

# Asked on the refusal of a name not on the list, with (name, port), before anything is resolved:
# the status of the task's request for it (`approved` lets it through) and the request's id
# (None: no request was raised; the status says why). See phase/network.py.
Asker = Callable[[str, int], tuple[str, str | None]]


class Proxy:
    def __init__(
        self,
        allowlist: list[str] | None,
        trusted: list,
        config: GatewayConfig,
        accounts: Accounting,
        budget: ByteBudget,
        asker: Asker | None = None,
    ) -> None:
        self.allowlist = allowlist  # network.domains: names and `*.` patterns
        self.asker = asker
        # (name, port) -> request id: approvals, exact pairs, kept apart from the patterns
        self.approved: dict[tuple[str, int], str] = {}
        self.trusted = trusted
        self.config = config
        self.accounts = accounts
        self.budget = budget

    async def check(self, host: str, port: int, ports: list[int], which: str) -> str:
        """The address to connect to, or Refused with the reason (recorded). ``ports``: those
        this kind of request may reach (``which`` names the setting). A name off the list is
        never resolved before its request is approved: the host's DNS is not the worker's
        channel out (a refusal looks nothing up)."""
        refuse = self.accounts.refused
        raw, host = host, shown(host)
        if self.allowlist is None:
            refuse("host", host, "general egress is closed (network.mode none)", port=port)
            raise Refused(403, f"{host} is not reachable: this task's network.mode is none")
        if port not in ports:
            refuse("host", host, f"port {port} is not allowed", port=port)
            raise Refused(403, f"port {port} is not allowed (gateway.{which})")
        approved, target = None, host
        if not name_allowed(host, self.allowlist):  # nothing resolved before an approval
            if self.asker is None:
                refuse("host", host, "not in network.domains", port=port)
                raise Refused(403, f"{host} is not in this task's network.domains")
            why = request_refusal(raw, self.trusted)
            if why is not None:
                refuse("host", host, f"not in network.domains; {why}: never asked for", port=port)
                raise Refused(
                    403,
                    f"{host} is not in this task's network.domains, and is {why}: it is refused "
                    "without a request",
                )
            target = raw.strip().lower().rstrip(".")  # the name asked for is the one resolved
            approved = await self._ask(target, port)
        timeout = self.config.connect_timeout_s
        addresses = await (resolve_approved if approved else resolve)(target, port, timeout)
        but = f"approved as request {approved}, but " if approved else ""
        if not addresses:
            refuse("host", host, f"{but}does not resolve", port=port)
            raise Refused(502, f"{host} {but}does not resolve")
        for address in addresses:  # every answer checked: no address of a split answer slips by
            why = address_refusal(address, self.trusted)
            if why is not None:
                refuse("host", host, f"{but}resolves to {why} ({address})", port=port)
                raise Refused(403, f"{host} {but}resolves to {why} ({address}); refused")
        return addresses[0]

    async def _ask(self, host: str, port: int) -> str:
        """The id of the task's approved request for ``host:port`` (an approval is for that
        port alone); otherwise Refused, naming the request the caller may answer."""
        assert self.asker is not None
        if (host, port) in self.approved:
            return self.approved[(host, port)]
        loop = asyncio.get_running_loop()
        status, request_id = await loop.run_in_executor(None, self.asker, host, port)
        if status == "approved" and request_id is not None:
            self.approved[(host, port)] = request_id
            return request_id
        if request_id is None:  # over max_requests, a name redaction would change, task ended
            why = f"not in network.domains (no request raised: {status})"
            self.accounts.refused("host", host, why, port=port)
            raise Refused(403, f"{host} is not in this task's network.domains")
        self.accounts.refused(
            "host", host, f"not in network.domains; request {request_id} is {status}", port=port
        )
        raise Refused(
            403,
            f"{host}:{port} is not in this task's network.domains; asked for it as request "
            f"{request_id} ({status}): "
            + ("try again once it is approved" if status == "pending" else "it stays refused"),
        )

    async def tunnel(self, exchange: Exchange, request: h11.Request) -> None:
        host, _, port_text = request.target.decode("latin-1").rpartition(":")
        if not host or not port_text.isdigit():
            raise Refused(400, "CONNECT needs host:port")
        host, port = host.strip("[]"), int(port_text)
        started = time.monotonic()
        # Raw TCP once tunnelled, so only TLS ports: on port 80 the Host inside is anyone's.
        address = await self.check(host, port, self.config.connect_ports, "connect_ports")
        try:
            upstream = await connect_tcp(address, port, self.config.connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            why = f"upstream unreachable ({exc.__class__.__name__})"
            self.accounts.refused("host", host, why, port=port)
            raise Refused(502, f"{host}:{port} is unreachable") from exc
        counts = [0, 0]
        try:
            await exchange.send(h11.Response(status_code=200, headers=[]))
            leftover, _ = exchange.conn.trailing_data
            counts[0] += len(leftover)
            await upstream.sendall(leftover, self.config.idle_timeout_s)
            exchange.release()  # from here on, each read takes its own share
            pumps = [
                asyncio.ensure_future(self._pump(exchange.sock, upstream, counts, 0)),
                asyncio.ensure_future(self._pump(upstream, exchange.sock, counts, 1)),
            ]
            try:
                await asyncio.wait(pumps, timeout=self.config.total_timeout_s)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (TimeoutError, ConnectionError, OSError):
            pass
        finally:
            upstream.close()
            where: Destination = {"host": host, "port": port}
            self.accounts.request(where, "CONNECT", 200, counts[0], counts[1], started)

    async def _pump(self, src: Conn, dst: Conn, counts: list[int], i: int) -> None:
        idle = self.config.idle_timeout_s
        try:
            while True:
                await src.readable(idle)
                async with self.budget.hold(READ) as size:
                    data = await src.recv(size, idle)
                    if not data:
                        break
                    counts[i] += len(data)
                    await dst.sendall(data, idle)
        except (TimeoutError, ConnectionError, OSError):
            pass
        finally:
            dst.end_writing()

    async def forward(
        self, session: aiohttp.ClientSession, exchange: Exchange, request: h11.Request
    ) -> bool:
        try:
            target = urlsplit(request.target.decode("latin-1"))
            hostname = target.hostname
        except ValueError as exc:
            raise Refused(400, "the proxy request's URL is malformed") from exc
        limit = self.config.max_request_mb * 2**20
        if target.scheme != "http" or not hostname:
            self.accounts.refused(
                "request", shown(request.target.decode("latin-1")), "not a proxy request"
            )
            raise Refused(400, "this is the gateway's proxy: send absolute http:// URLs or CONNECT")
        try:
            host, port = hostname, target.port or 80
        except ValueError as exc:
            raise Refused(400, "the proxy request's URL has a bad port") from exc
        address = await self.check(host, port, self.config.http_ports, "http_ports")
        length = content_length(request)
        if length is not None and length > limit:
            self.accounts.refused("host", host, "request body too large", port=port)
            raise Refused(413, f"request body over {limit // 2**20} MB (gateway.max_request_mb)")
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.headers
            if k.lower() not in _HOP
        ]
        headers.append(("Host", host if port == 80 else f"{host}:{port}"))
        if length is not None:
            headers.append(("content-length", str(length)))
        path = (target.path or "/") + (f"?{target.query}" if target.query else "")
        literal = f"[{address}]" if ":" in address else address
        out = Outgoing(
            request.method.decode(),
            f"http://{literal}:{port}{path}",
            headers,
            await exchange.body_or_none(request, limit),
            where={"host": host, "port": port},
        )
        return await stream(session, exchange, out, self.config, self.accounts)
