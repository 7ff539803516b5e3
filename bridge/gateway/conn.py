"""A socket of the gateway's (a sandbox's connection, or a tunnel's upstream) driven by the event
loop's socket calls: nothing is read until it is asked for, and never more than asked, so no
buffer fills behind the gateway's back (asyncio's streams read ahead into a buffer of their own
per connection). Every wait is bounded."""

from __future__ import annotations

import asyncio
import socket


class Conn:
    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._loop = asyncio.get_running_loop()

    async def readable(self, timeout: float) -> None:
        """Wait until something can be read (data or the peer's end), without reading it;
        TimeoutError past ``timeout``."""
        loop, fd = self._loop, self.sock.fileno()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, wake)
        try:
            await asyncio.wait_for(ready, timeout)
        finally:
            loop.remove_reader(fd)

    async def recv(self, nbytes: int, timeout: float) -> bytes:
        """At most ``nbytes``; b"" at the peer's end."""
        try:
            return await asyncio.wait_for(self._loop.sock_recv(self.sock, nbytes), timeout)
        except ConnectionResetError:
            return b""

    async def sendall(self, data: bytes, timeout: float) -> None:
        """All of ``data``, or TimeoutError (a peer that stops reading) / ConnectionError."""
        if data:
            await asyncio.wait_for(self._loop.sock_sendall(self.sock, data), timeout)

    def end_writing(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


async def connect_tcp(address: str, port: int, timeout: float) -> Conn:
    """A TCP connection to an address the proxy checked (OSError / TimeoutError if not)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(
            asyncio.get_running_loop().sock_connect(sock, (address, port)), timeout
        )
    except BaseException:
        sock.close()
        raise
    return Conn(sock)
