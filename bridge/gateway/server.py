"""One task's gateway: the only way out of a sandbox that has no network interface but `lo`.

It listens on two Unix sockets in a folder bind-mounted into the worker container, where a relay
forwards 127.0.0.1:7800 and 127.0.0.1:7801 to them:

- `routes.sock`: model routes by path prefix (`/anthropic/v1/messages` -> the route's upstream).
  Whatever credential the sandbox sent is dropped and the real key, from the host's environment,
  is added on the way out; responses (server-sent events included) stream back as they arrive.
- `proxy.sock`: the allowlist proxy (proxy.py), closed unless the task says
  `network: {mode: allowlist}`.

The gateway runs its own asyncio loop in a thread of the task's runner, alive exactly as long as
the worker's container; a runner that adopts the container after a crash starts it again in the
same folder (the folder, not the socket, is what the container has mounted).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import aiohttp
import h11

from bridge.config import GatewayConfig
from bridge.gateway.accounting import Accounting, Usage
from bridge.gateway.exchange import HOP_BY_HOP, Exchange, Refused, content_length, shown
from bridge.gateway.policy import Route, check_ranges
from bridge.gateway.proxy import Proxy
from bridge.gateway.upstream import Outgoing, stream
from bridge.gateway.usage import request_model

ROUTES_SOCKET = "routes.sock"
PROXY_SOCKET = "proxy.sock"
# Whatever credential the sandbox holds (a placeholder) never leaves; the route adds its own.
_DROP = HOP_BY_HOP | {
    b"authorization",
    b"proxy-authorization",
    b"x-api-key",
    b"api-key",
    b"x-goog-api-key",
    b"anthropic-api-key",
    b"openai-api-key",
    b"cookie",
    b"accept-encoding",
}


class Gateway:
    """Start it before the worker's container; stop it when the container is gone."""

    def __init__(
        self,
        folder: Path,
        routes: dict[str, Route],
        allowlist: list[str] | None,
        config: GatewayConfig,
        emit: Callable[[str, dict[str, Any]], None],
        owner: tuple[int, int] | None = None,
    ) -> None:
        self.folder = folder
        self.routes = routes
        self.config = config
        self.owner = owner
        self.accounts = Accounting(emit, config.max_events)
        self.proxy = Proxy(allowlist, check_ranges(config.trusted_ranges), config, self.accounts)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task] = set()
        self._busy_noted = False

    @property
    def usage(self) -> Usage:
        return self.accounts.usage

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Gateway:
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in (ROUTES_SOCKET, PROXY_SOCKET):
            (self.folder / name).unlink(missing_ok=True)  # a dead runner's, at the same path
        # Only the sandbox identity (and the bridge) may open what is in here.
        os.chmod(self.folder, 0o700)
        if self.owner is not None:
            os.chown(self.folder, *self.owner)
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="gateway", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), loop).result(timeout=30)
        return self

    async def _listen(self) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        for name, kind in ((ROUTES_SOCKET, "route"), (PROXY_SOCKET, "proxy")):
            path = self.folder / name
            server = await asyncio.start_unix_server(
                lambda r, w, k=kind: self._accept(r, w, k), path=str(path)
            )
            os.chmod(path, 0o600)
            if self.owner is not None:
                os.chown(path, *self.owner)
            self._servers.append(server)

    def _accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, kind: str
    ) -> None:
        if len(self._tasks) >= self.config.max_connections:
            # Refused at once: the sandbox cannot hold the runner's descriptors or memory.
            if not self._busy_noted:
                self.accounts.refused("connection", kind, "too many connections at once")
                self._busy_noted = True
            writer.close()
            return
        task = asyncio.ensure_future(self._serve(reader, writer, kind))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self) -> None:
        """Close the sockets, end every connection, remove the sockets. Idempotent."""
        loop = self._loop
        if loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=30)
        except Exception:  # noqa: BLE001 - a gateway that fails to close still goes away
            pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=30)
        loop.close()
        self._loop = None
        for name in (ROUTES_SOCKET, PROXY_SOCKET):
            (self.folder / name).unlink(missing_ok=True)

    async def _close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        if self._session is not None:
            await self._session.close()

    # -- connections --------------------------------------------------------------------------

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, kind: str
    ) -> None:
        cfg = self.config
        exchange = Exchange(reader, writer, cfg.idle_timeout_s, cfg.read_deadline_s)
        try:
            while True:
                try:
                    event = await exchange.next()
                except Refused as exc:  # the request's head took too long
                    await exchange.answer(exc.status, exc.reason)
                    return
                if not isinstance(event, h11.Request):
                    return
                try:
                    keep = await asyncio.wait_for(
                        self._handle(exchange, event, kind), cfg.total_timeout_s
                    )
                except Refused as exc:
                    await exchange.answer(exc.status, exc.reason)
                    keep = exc.status < 500
                if not keep or not exchange.reusable:
                    if exchange.conn.their_state is not h11.DONE:
                        await exchange.linger()  # the answer must not be lost to a reset
                    return
                exchange.conn.start_next_cycle()
        except (h11.RemoteProtocolError, h11.LocalProtocolError, ValueError) as exc:
            self.accounts.refused("request", kind, shown(f"malformed HTTP exchange ({exc})"))
            await exchange.answer(400, "malformed HTTP request")
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _handle(self, exchange: Exchange, request: h11.Request, kind: str) -> bool:
        assert self._session is not None
        if kind == "route":
            return await self._route(exchange, request)
        if request.method == b"CONNECT":
            await self.proxy.tunnel(exchange, request)
            return False
        return await self.proxy.forward(self._session, exchange, request)

    async def _route(self, exchange: Exchange, request: h11.Request) -> bool:
        assert self._session is not None
        name, _, rest = request.target.decode("latin-1").lstrip("/").partition("/")
        limit = self.config.max_request_mb * 2**20
        route = self.routes.get(name)
        if route is None:
            self.accounts.refused("route", shown(name), "no such route for this task")
            await exchange.body(limit)
            known = ", ".join(sorted(self.routes)) or "none"
            raise Refused(
                404, f"no gateway route '{shown(name, 60)}' for this task (it has: {known})"
            )
        path = unquote(rest.partition("?")[0])
        if ".." in path.split("/") or "\\" in path:  # the key is for the route's path only
            self.accounts.refused("route", name, "a path that leaves the route")
            raise Refused(400, "the path leaves the route's upstream prefix")
        length = content_length(request)
        if length is not None and length > limit:
            self.accounts.refused("route", name, "request body too large")
            raise Refused(413, f"request body over {limit // 2**20} MB (gateway.max_request_mb)")
        started = time.monotonic()
        try:
            body = await exchange.body(limit)
        except Refused:
            self.accounts.request({"route": name}, request.method.decode(), 413, 0, 0, started)
            raise
        auth = route.auth_header()
        # The sandbox's copies of credentials (and of the route's own header) never leave, and
        # it cannot ask for compression (so token usage can always be read from the answer).
        drop = _DROP | ({auth[0].encode()} if auth else set())
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.headers
            if k.lower() not in drop
        ]
        if auth is not None:
            headers.append(auth)
        out = Outgoing(
            request.method.decode(),
            f"{route.upstream}/{rest}",
            headers,
            body,
            where={"route": name},
            model=request_model(body),
            count_tokens=True,
        )
        return await stream(self._session, exchange, out, self.config, self.accounts)
