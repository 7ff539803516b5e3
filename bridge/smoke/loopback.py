"""An aiohttp server on the host's loopback, run on a thread of its own: the scripted model
server (and the gateway tests' upstream) are one of these, with their own routes."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class LoopbackServer:
    """Subclasses add their routes in `routes`; `port` 0 picks a free one. `release` is set on
    stop, to end requests a subclass holds open."""

    port: int
    release: threading.Event

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def start(self):  # noqa: ANN201 (returns the subclass)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 2**20)
        self.routes(app)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        server = site._server  # noqa: SLF001 - the port the kernel chose for port 0
        assert server is not None and hasattr(server, "sockets")
        self.port = server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        self.release.set()
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
