"""The gateway across machines (bridge/cluster/relay.py), engine-free over loopback: a node's
relay folder carries a container's connections to the control host's hub, which joins them to
that turn's gateway sockets; the hostile ways (no secret, a guessed one, one revoked at the
turn's end, another task's, a silent or oversized greeting, another socket's name) reach
nothing."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.cluster.relay import NAMES, RelayFolder, RelayHub


class FakeGateway:
    """A gateway folder whose two sockets answer `<its name>:<what came>` and count who
    connected (what the host's gateway would add the key to)."""

    def __init__(self, folder: Path, tag: str) -> None:
        folder.mkdir(parents=True)
        self.tag, self.accepted = tag, 0
        self._listeners = []
        for name, file in NAMES.items():
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(folder / file))
            listener.listen(16)
            self._listeners.append(listener)
            threading.Thread(target=self._accept, args=(listener, name), daemon=True).start()

    def _accept(self, listener: socket.socket, name: str) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._answer, args=(conn, name), daemon=True).start()

    def _answer(self, conn: socket.socket, name: str) -> None:
        with conn:
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            try:
                conn.sendall(f"{self.tag}/{name}:".encode() + data)
            except BrokenPipeError:
                pass  # the relay ended the connection (a revoked turn)

    def close(self) -> None:
        for listener in self._listeners:
            listener.close()


def ask(folder: Path, name: str, data: bytes, timeout: float = 10) -> bytes:
    """What the relay folder's socket ``name`` answers to ``data`` (sent, then half-closed)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(folder / NAMES[name]))
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return b""  # refused while it spoke: what it gets is nothing
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass  # ended abruptly (refused, revoked): what came before is the answer
        return answer


def ended(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` without a byte (gracefully or by a reset)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def hub() -> Iterator[RelayHub]:
    running = RelayHub("127.0.0.1", handshake_s=1.0).start()
    yield running
    running.stop()


@pytest.fixture
def gateways(workdir: Path) -> Iterator[tuple[FakeGateway, FakeGateway]]:
    made = FakeGateway(workdir / "host" / "a", "a"), FakeGateway(workdir / "host" / "b", "b")
    yield made
    for gateway in made:
        gateway.close()


def relay(workdir: Path, hub: RelayHub, secret: str, name: str = "node") -> RelayFolder:
    return RelayFolder(workdir / name / "run", hub.address, secret).start()


def test_a_containers_connection_reaches_its_turns_gateway_both_sockets(hub, gateways, workdir):
    secret = hub.open_turn(workdir / "host" / "a")
    node = relay(workdir, hub, secret)
    try:
        assert ask(node.folder, "routes", b"GET /v1/models") == b"a/routes:GET /v1/models"
        big = bytes(range(256)) * 4096  # 1 MiB each way
        assert ask(node.folder, "proxy", big) == b"a/proxy:" + big
    finally:
        node.stop()
    assert not node.folder.exists(), "the turn's folder goes with it"


def test_a_guessed_secret_or_another_tasks_reaches_nothing(hub, gateways, workdir):
    a, b = gateways
    hub.open_turn(workdir / "host" / "a")
    secret_b = hub.open_turn(workdir / "host" / "b")
    guessed = relay(workdir, hub, "0" * 64, "guess")
    other = relay(workdir, hub, secret_b, "other")
    try:
        assert ask(guessed.folder, "routes", b"x") == b""
        assert a.accepted == b.accepted == 0, "refused before any gateway saw it"
        # B's secret reaches B's gateway and only it: a secret names one folder.
        assert ask(other.folder, "routes", b"x") == b"b/routes:x"
        assert a.accepted == 0
    finally:
        guessed.stop()
        other.stop()


def test_a_secret_revoked_at_the_turns_end_ends_its_connections_and_reaches_nothing_after(
    hub, gateways, workdir
):
    a, _ = gateways
    secret = hub.open_turn(workdir / "host" / "a")
    node = relay(workdir, hub, secret)
    try:
        held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        held.settimeout(10)
        held.connect(str(node.folder / NAMES["routes"]))
        held.sendall(b"a request still open")
        deadline = time.monotonic() + 10
        while a.accepted == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert a.accepted == 1
        hub.close_turn(secret)
        assert ended(held), "the open connection ended with the turn"
        held.close()
        assert ask(node.folder, "routes", b"again") == b""
        assert a.accepted == 1
    finally:
        node.stop()


@pytest.mark.parametrize(
    "greeting",
    [
        b"",  # says nothing: closed after the handshake's time
        b"WBRELAY1 " + b"f" * 64 + b" ../b/routes\n",  # another socket's name
        b"WBRELAY1 " + b"x" * 300 + b"\n",  # past the greeting's bound
        b"GET / HTTP/1.1\r\nHost: hub\r\n\r\n",  # not ours at all
    ],
)
def test_a_raw_connection_to_the_hub_gets_not_a_byte(hub, gateways, workdir, greeting):
    hub.open_turn(workdir / "host" / "a")
    with socket.create_connection(hub.address, timeout=10) as sock:
        if greeting:
            sock.sendall(greeting)
        assert ended(sock)
    assert gateways[0].accepted == 0


def test_silent_connections_past_the_bound_are_closed_at_once(workdir):
    """Anyone on the cluster network holding connections open without a word cannot take the
    control host's descriptors: past MAX_PENDING at once, one more is closed at once."""
    from bridge.cluster.relay import MAX_PENDING

    hub = RelayHub("127.0.0.1", handshake_s=60).start()
    held = []
    try:
        for _ in range(MAX_PENDING):
            held.append(socket.create_connection(hub.address, timeout=10))
        extra = socket.create_connection(hub.address, timeout=10)
        held.append(extra)
        assert ended(extra), "closed long before the handshake's 60 s"
        held[0].settimeout(0.2)
        with pytest.raises(TimeoutError):
            held[0].recv(1)  # the ones within the bound wait for their greeting
    finally:
        for sock in held:
            sock.close()
        hub.stop()
