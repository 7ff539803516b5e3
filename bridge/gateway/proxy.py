"""The allowlist proxy: CONNECT tunnels (HTTPS) and absolute-URI requests (HTTP) to names the
task lists, on allowed ports, at addresses resolved here and checked on every connection (a
listed name that resolves to a loopback, private, link-local or metadata address is refused
unless config trusts that range). A tunnel holds no budget while it is idle: each read, in
either direction, takes a share of the gateway's byte budget until it is passed on."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
import h11

from bridge.config import GatewayConfig
from bridge.gateway.accounting import Accounting
from bridge.gateway.budget import ByteBudget
from bridge.gateway.conn import Conn, connect_tcp
from bridge.gateway.exchange import HOP_BY_HOP, READ, Exchange, Refused, content_length, shown
from bridge.gateway.policy import address_refusal, name_allowed, resolve
from bridge.gateway.upstream import Outgoing, stream

_HOP = HOP_BY_HOP | {b"proxy-authorization"}

# Asked on the refusal of a name not on the list, with (host, port): the status of the task's
# request for it (`approved` lets it through) and the request's id (see phase/network.py).
Asker = Callable[[str, int], tuple[str, str | None]]


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
        self.allowlist = allowlist
        self.asker = asker
        self.trusted = trusted
        self.config = config
        self.accounts = accounts
        self.budget = budget

    async def check(self, host: str, port: int, ports: list[int], which: str) -> str:
        """The address to connect to, or Refused with the reason (recorded). ``ports``: those
        this kind of request may reach (``which`` names the setting)."""
        refuse = self.accounts.refused
        host = shown(host)
        if self.allowlist is None:
            refuse("host", host, "general egress is closed (network.mode none)", port=port)
            raise Refused(403, f"{host} is not reachable: this task's network.mode is none")
        if port not in ports:
            refuse("host", host, f"port {port} is not allowed", port=port)
            raise Refused(403, f"port {port} is not allowed (gateway.{which})")
        listed = name_allowed(host, self.allowlist)
        if not listed and (self.asker is None or _is_address(host)):
            refuse("host", host, "not in network.domains", port=port)
            raise Refused(403, f"{host} is not in this task's network.domains")
        addresses = await resolve(host, port, self.config.connect_timeout_s)
        if not addresses:
            refuse("host", host, "does not resolve", port=port)
            raise Refused(502, f"{host} does not resolve")
        for address in addresses:  # every answer checked: no address of a split answer slips by
            why = address_refusal(address, self.trusted)
            if why is not None:
                refuse("host", host, f"resolves to {why} ({address})", port=port)
                raise Refused(403, f"{host} resolves to {why} ({address}); refused")
        if not listed:  # a public name off the list: the task's request for it decides
            await self._ask(host, port)
        return addresses[0]

    async def _ask(self, host: str, port: int) -> None:
        """Let ``host`` through if the task's request for it is approved (it joins the live
        allowlist); otherwise refuse, naming the request the caller may answer."""
        assert self.asker is not None and self.allowlist is not None
        loop = asyncio.get_running_loop()
        status, request_id = await loop.run_in_executor(None, self.asker, host, port)
        if status == "approved":
            self.allowlist.append(host.lower().rstrip("."))
            return
        if request_id is None:
            why = "not in network.domains (and the task has raised its most requests)"
            self.accounts.refused("host", host, why, port=port)
            raise Refused(403, f"{host} is not in this task's network.domains")
        self.accounts.refused(
            "host", host, f"not in network.domains; request {request_id} is {status}", port=port
        )
        raise Refused(
            403,
            f"{host} is not in this task's network.domains; asked for it as request "
            f"{request_id} ({status}): try again once it is approved",
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
            where = {"host": host, "port": port}
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
