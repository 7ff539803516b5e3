"""One task's gateway: the only way out of a sandbox that has no network interface but `lo`.

It listens on two Unix sockets in a folder bind-mounted into the worker container, where a relay
forwards 127.0.0.1:7800 and 127.0.0.1:7801 to them:

- `routes.sock`: model routes by path prefix (`/anthropic/v1/messages` -> the route's upstream),
  each letting through only its own list of methods and paths, spelled plainly (paths.py).
  Whatever credential the sandbox sent is dropped and the real key, from the host's environment,
  is added on the way out; request bodies stream out and responses (server-sent events
  included) stream back as they arrive.
- `proxy.sock`: the allowlist proxy (proxy.py), closed unless the task says
  `network: {mode: allowlist}`.

Its memory is bounded by design: no body is ever held whole, and the bytes held in flight, across
all its connections, stay within one byte budget (`gateway.memory_budget_mb`, budget.py).

The gateway runs its own asyncio loop in a thread of the task's runner, alive exactly as long as
the worker's container; a runner that adopts the container after a crash starts it again in the
same folder (the folder, not the socket, is what the container has mounted).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import h11

from bridge.config.settings import GatewayConfig
from bridge.events import EventData
from bridge.gateway.accounting import Accounting, Usage
from bridge.gateway.budget import ByteBudget
from bridge.gateway.conn import Conn
from bridge.gateway.exchange import HOP_BY_HOP, Exchange, Refused, content_length, shown
from bridge.gateway.paths import BadTarget, allowed, parse_target
from bridge.gateway.policy import Route, check_ranges
from bridge.gateway.proxy import Asker, Proxy
from bridge.gateway.upstream import READ_BUFSIZE, Outgoing, stream

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
        emit: Callable[[str, EventData], None],
        owner: tuple[int, int] | None = None,
        recorded_events: int = 0,
        asker: Asker | None = None,
    ) -> None:
        self.folder = folder
        self.routes = routes
        self.config = config
        self.owner = owner
        self.accounts = Accounting(emit, config.max_events, recorded_events)
        self.budget = ByteBudget(config.memory_budget_mb * 2**20)
        self.proxy = Proxy(
            allowlist,
            check_ranges(config.trusted_ranges),
            config,
            self.accounts,
            self.budget,
            asker,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listeners: list[socket.socket] = []
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
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            read_bufsize=READ_BUFSIZE,
        )
        for name, kind in ((ROUTES_SOCKET, "route"), (PROXY_SOCKET, "proxy")):
            path = self.folder / name
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
            os.chmod(path, 0o600)
            if self.owner is not None:
                os.chown(path, *self.owner)
            listener.listen(128)
            listener.setblocking(False)
            self._listeners.append(listener)
            self._spawn(self._accept_loop(listener, kind))

    def _spawn(self, coroutine: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept_loop(self, listener: socket.socket, kind: str) -> None:
        loop = asyncio.get_running_loop()
        connections: set[asyncio.Task] = set()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError:
                return  # closed by stop()
            if len(connections) >= self.config.max_connections:
                # Refused at once: the sandbox cannot hold the runner's descriptors or memory.
                if not self._busy_noted:
                    self.accounts.refused("connection", kind, "too many connections at once")
                    self._busy_noted = True
                sock.close()
                continue
            task = self._spawn(self._serve(Conn(sock), kind))
            connections.add(task)
            task.add_done_callback(connections.discard)

    def stop(self, *, keep_folder: bool = False) -> None:
        """Close the sockets, end every connection, remove the sockets and the folder, unless
        ``keep_folder``: a container that may still run has it bound, and the gateway of the
        runner adopting that container listens in the same folder. Idempotent."""
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
        if keep_folder:
            return
        try:
            self.folder.rmdir()
        except OSError:
            pass  # gone already, or holding what is not ours: prune's to look at

    async def _close(self) -> None:
        for listener in self._listeners:
            listener.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    # -- connections --------------------------------------------------------------------------

    async def _serve(self, conn: Conn, kind: str) -> None:
        cfg = self.config
        exchange = Exchange(conn, self.budget, cfg.idle_timeout_s, cfg.read_deadline_s)
        try:
            while await exchange.begin():
                try:
                    if not await self._one(exchange, kind):
                        return
                finally:
                    exchange.release()
                exchange.conn.start_next_cycle()
        except (h11.RemoteProtocolError, h11.LocalProtocolError, ValueError) as exc:
            self.accounts.refused("request", kind, shown(f"malformed HTTP exchange ({exc})"))
            await exchange.answer(400, "malformed HTTP request")
        except (TimeoutError, ConnectionError, OSError):
            pass
        finally:
            exchange.release()
            conn.close()

    async def _one(self, exchange: Exchange, kind: str) -> bool:
        """One request and its answer, under the exchange's share of the budget; True when the
        connection may carry another."""
        try:
            event = await exchange.next()
        except Refused as exc:  # the request's head took too long
            await exchange.answer(exc.status, exc.reason)
            return False
        if not isinstance(event, h11.Request):
            return False
        try:
            keep = await asyncio.wait_for(
                self._handle(exchange, event, kind), self.config.total_timeout_s
            )
        except Refused as exc:
            await exchange.answer(exc.status, exc.reason)
            keep = exc.status < 500
        if not keep or not exchange.reusable:
            if exchange.conn.their_state is not h11.DONE:
                await exchange.linger()  # the answer must not be lost to a reset
            return False
        return True

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
        method = request.method.decode("latin-1")
        try:
            target = parse_target(request.target)
        except BadTarget as exc:
            self.accounts.refused("route", shown(request.target.decode("latin-1")), str(exc))
            raise Refused(400, f"refused: {exc}") from None
        name = target.route
        route = self.routes.get(name)
        if route is None:  # answered at once: its body is not read
            self.accounts.refused("route", shown(name), "no such route for this task")
            known = ", ".join(sorted(self.routes)) or "none"
            raise Refused(
                404, f"no gateway route '{shown(name, 60)}' for this task (it has: {known})"
            )
        if not allowed(route.paths, method, target.path):
            shown_path = shown(target.path, 120)
            self.accounts.refused(
                "route", name, f"{method} {shown_path} is not on the route's list"
            )
            raise Refused(
                403, f"{method} {shown_path} is not a model call the route '{name}' lets through"
            )
        limit = self.config.max_request_mb * 2**20
        length = content_length(request)
        if length is not None and length > limit:
            self.accounts.refused("route", name, "request body too large")
            raise Refused(413, f"request body over {limit // 2**20} MB (gateway.max_request_mb)")
        auth = route.auth_header()
        # The sandbox's copies of credentials (and of the route's own header) never leave, and
        # it cannot ask for compression (so token usage can always be read from the answer).
        drop = _DROP | ({auth[0].encode()} if auth else set())
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.headers
            if k.lower() not in drop
        ]
        if length is not None:
            headers.append(("content-length", str(length)))
        if auth is not None:
            headers.append(auth)
        out = Outgoing(
            method,
            route.upstream + target.raw_rest.decode("ascii"),
            headers,
            await exchange.body_or_none(request, limit),
            where={"route": name},
            count_tokens=True,
        )
        return await stream(self._session, exchange, out, self.config, self.accounts)
