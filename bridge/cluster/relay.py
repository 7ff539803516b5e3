"""The gateway across machines: keys never leave the control host.

A task's gateway (bridge/gateway/) listens on two Unix sockets in a folder on the control host,
and the worker's container reaches them through that folder, bound read-only at
/run/worker-bridge (its only way out: it has no interface but `lo`). A container on a node
gets the same: the node's agent makes a folder with the same two socket names
(`RelayFolder`), and carries each connection made there to the control host's `RelayHub` over
the cluster network, which joins it to the task's real gateway socket. The container and
wb-relay inside it see no difference; the key is added by the gateway on the control host, as
on one machine.

Each turn has its own secret, minted by the hub when the turn starts (`open_turn`) and revoked
when it ends (`close_turn`, which also ends the connections still open with it). A connection
presents it in its first line, `WBRELAY1 <secret> <routes|proxy>`, within HANDSHAKE_S and
MAX_HANDSHAKE bytes; the hub answers `OK` and from then on copies bytes both ways, or closes it
without a word. A secret names one gateway folder: one task's container cannot reach another
task's gateway, and a secret after its turn reaches nothing. The cluster network is trusted
infrastructure (docs/cluster.md): the secret keeps one turn's traffic to its own gateway and
off the hub after the turn, not an eavesdropper on that network away.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
import stat
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.errors import BridgeError
from bridge.gateway.server import PROXY_SOCKET, ROUTES_SOCKET

MAGIC = b"WBRELAY1"
NAMES = {"routes": ROUTES_SOCKET, "proxy": PROXY_SOCKET}
HANDSHAKE_S = 5.0  # a connection that has not said who it is by then is closed
MAX_HANDSHAKE = 256
MAX_PENDING = 64  # connections not yet greeted, at once: past it, one more is closed at once
MAX_PER_TURN = 64  # a turn's connections at once (the gateway's own bound, config gateway.*)
CHUNK = 64 * 1024
START_S = 30.0


class _Loop:
    """An asyncio loop in a thread of its own, as the gateway runs one."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=START_S)

    def close(self) -> None:
        """Every task of the loop cancelled (their sockets closed with them), then the loop."""
        self.call(_cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=START_S)
        self.loop.close()


@dataclass
class _Turn:
    folder: Path  # the task's gateway folder on the control host
    open: set[asyncio.StreamWriter] = field(default_factory=set)
    closed: bool = False  # revoked: a connection greeted before is not joined after


class RelayHub:
    """The control host's end: a TCP listener on ``host``:``port`` (0: any free port) that
    joins each connection presenting a live turn's secret to that turn's gateway socket."""

    def __init__(self, host: str, port: int = 0, handshake_s: float = HANDSHAKE_S) -> None:
        self._bind = (host, port)
        self._handshake_s = handshake_s
        self._turns: dict[str, _Turn] = {}
        self._pending = 0
        self._loop: _Loop | None = None
        self._server: asyncio.base_events.Server | None = None
        self.address: tuple[str, int] = (host, port)

    def start(self) -> RelayHub:
        """Listening, or OSError (the port is taken) with nothing left running."""
        self._loop = _Loop("relay-hub")
        try:
            self._server = self._loop.call(asyncio.start_server(self._serve, *self._bind))
        except OSError:
            self._loop.close()
            self._loop = None
            raise
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = (host, port)
        return self

    def open_turn(self, folder: Path) -> str:
        """A new secret for the gateway in ``folder``, live until `close_turn`."""
        secret = secrets.token_hex(32)
        self._turns[secret] = _Turn(folder)
        return secret

    def close_turn(self, secret: str) -> None:
        """The secret revoked and every connection still open with it ended."""
        turn = self._turns.pop(secret, None)
        if turn is not None and self._loop is not None:
            self._loop.call(_revoke(turn))

    def stop(self) -> None:
        for secret in list(self._turns):
            self.close_turn(secret)
        if self._loop is None:
            return
        if self._server is not None:
            self._server.close()
        self._loop.close()
        self._loop = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._pending >= MAX_PENDING:
            writer.transport.abort()
            return
        self._pending += 1
        try:
            turn, name = await asyncio.wait_for(self._greeted(reader), self._handshake_s)
        except (TimeoutError, OSError, ValueError):
            turn = None
        finally:
            self._pending -= 1
        if turn is None or turn.closed or len(turn.open) >= 2 * MAX_PER_TURN:
            writer.transport.abort()  # closed without a word: nothing to learn by guessing
            return
        try:
            gateway_r, gateway_w = await asyncio.open_unix_connection(turn.folder / NAMES[name])
        except OSError:
            writer.transport.abort()
            return
        if turn.closed:  # revoked while the gateway was being reached
            gateway_w.transport.abort()
            writer.transport.abort()
            return
        writer.write(b"OK\n")
        turn.open.update((writer, gateway_w))
        try:
            await _join(reader, writer, gateway_r, gateway_w)
        finally:
            turn.open.difference_update((writer, gateway_w))

    async def _greeted(self, reader: asyncio.StreamReader) -> tuple[_Turn | None, str]:
        said = b""
        while b"\n" not in said:  # read within MAX_HANDSHAKE bytes, never a line of any length
            chunk = await reader.read(MAX_HANDSHAKE - len(said))
            if not chunk or len(said) + len(chunk) >= MAX_HANDSHAKE:
                return None, ""
            said += chunk
        line, _, rest = said.partition(b"\n")
        if rest:  # the node waits for OK before a byte more
            return None, ""
        parts = line.split(b" ")
        if len(parts) != 3 or parts[0] != MAGIC or parts[2].decode(errors="replace") not in NAMES:
            return None, ""
        return self._turn_of(parts[1]), parts[2].decode()

    def _turn_of(self, presented: bytes) -> _Turn | None:
        found = None
        for secret, turn in list(self._turns.items()):  # every one compared, in constant time
            if hmac.compare_digest(presented, secret.encode()):
                found = turn
        return found


class RelayFolder:
    """A node's end for one turn: ``folder`` gets the gateway's two socket names, and each
    connection made to one is carried to the hub at ``hub`` with the turn's ``secret``.
    ``owner``: the sandbox identity that must open the sockets (as the gateway's own are)."""

    def __init__(
        self,
        folder: Path,
        hub: tuple[str, int],
        secret: str,
        owner: tuple[int, int] | None = None,
    ) -> None:
        self.folder = folder
        self._hub = hub
        self._secret = secret.encode()
        self._owner = owner
        self._loop: _Loop | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._open: set[asyncio.StreamWriter] = set()

    def start(self) -> RelayFolder:
        self.folder.mkdir(parents=True, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(self.folder).st_mode):  # a link there is not followed
            raise BridgeError(f"{self.folder} is not a folder; the relay cannot use it.")
        os.chmod(self.folder, 0o700)
        if self._owner is not None:
            os.chown(self.folder, *self._owner)
        self._loop = _Loop("relay-folder")
        for name, file in NAMES.items():
            path = self.folder / file
            path.unlink(missing_ok=True)
            self._servers.append(self._loop.call(self._listen(path, name)))
            os.chmod(path, 0o600)
            if self._owner is not None:
                os.chown(path, *self._owner)
        return self

    def stop(self) -> None:
        """The sockets closed and removed, every connection ended, the folder removed."""
        if self._loop is None:
            return
        for server in self._servers:
            server.close()
        self._loop.call(_close_all(self._open))
        self._loop.close()
        self._loop = None
        for file in NAMES.values():
            (self.folder / file).unlink(missing_ok=True)
        try:
            self.folder.rmdir()
        except OSError:
            pass

    async def _listen(self, path: Path, name: str) -> asyncio.base_events.Server:
        async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._carry(reader, writer, name)

        return await asyncio.start_unix_server(carry, path=str(path))

    async def _carry(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str
    ) -> None:
        try:
            hub_r, hub_w = await asyncio.open_connection(*self._hub)
            hub_w.write(MAGIC + b" " + self._secret + b" " + name.encode() + b"\n")
            answer = await asyncio.wait_for(hub_r.readline(), HANDSHAKE_S)
        except (OSError, TimeoutError):
            writer.close()
            return
        if answer != b"OK\n":
            hub_w.close()
            writer.close()
            return
        self._open.update((writer, hub_w))
        try:
            await _join(reader, writer, hub_r, hub_w)
        finally:
            self._open.difference_update((writer, hub_w))


async def _join(
    a_r: asyncio.StreamReader,
    a_w: asyncio.StreamWriter,
    b_r: asyncio.StreamReader,
    b_w: asyncio.StreamWriter,
) -> None:
    """Bytes both ways until both sides have ended; then both closed."""
    await asyncio.gather(_copy(a_r, b_w), _copy(b_r, a_w), return_exceptions=True)
    for writer in (a_w, b_w):
        writer.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, RuntimeError):
        writer.close()


async def _close_all(writers: set[asyncio.StreamWriter]) -> None:
    for writer in list(writers):
        writer.transport.abort()  # close() would keep the socket while a peer holds data back
    writers.clear()


async def _cancel_all() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _revoke(turn: _Turn) -> None:
    turn.closed = True
    await _close_all(turn.open)
