"""Raw HTTP/1.1 clients for the listener's hostile tests: sockets from a chosen loopback address
that send part of a request (or nothing), read whatever the server answers until it closes, and
count the connections the server process holds, as seen from outside (psutil)."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable

import psutil

SOCKET_TIMEOUT_S = 30


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A TCP connection to 127.0.0.1:PORT from SOURCE (any 127.0.0.0/8 address on loopback)."""
    return socket.create_connection(
        ("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S, source_address=(source, 0)
    )


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset ends it too)."""
    got = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


def request(port: int, text: str, source: str = "127.0.0.1") -> bytes:
    """One whole request on a new connection, and the answer up to the server's close (the
    request should say `Connection: close`, or be refused)."""
    with connect(port, source) as sock:
        sock.sendall(text.encode())  # no half-close: uvicorn would drop the connection on EOF
        return read_until_closed(sock)


HEALTH = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def health(port: int, source: str = "127.0.0.1") -> bytes:
    """GET /healthz from SOURCE on a new connection: the answer, or a refusal."""
    return request(port, HEALTH, source)


def trickle_until_closed(sock: socket.socket, byte: bytes, pace_s: float, deadline_s: float) -> int:
    """Send one byte per PACE_S until the server answers or closes (waiting on the socket is
    the pacing); returns how many bytes were sent. Fails if the server still reads at the end."""
    sent = 0
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        readable, _, _ = select.select([sock], [], [], pace_s)
        if readable:
            return sent
        try:
            sock.sendall(byte)
        except (BrokenPipeError, ConnectionResetError):
            return sent
        sent += 1
    raise AssertionError(f"the server still read a body sent one byte per {pace_s} s after {sent}")


def held_connections(pid: int, port: int) -> int:
    """TCP connections on PORT that the server process holds open."""
    return sum(
        1
        for conn in psutil.Process(pid).net_connections(kind="tcp")
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_ESTABLISHED
    )


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 30) -> None:
    """Poll CONDITION until it holds; fail naming WHAT after DEADLINE_S."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"not within {deadline_s} s: {what}"
        time.sleep(0.1)
