"""The collector around work that keeps what it makes (`bridge.host.heap`): the long-lived servers
leave their start-up heap out of later collections (gc.freeze), just before they serve (the MCP
server on stdio, and the HTTP listener the MCP server over HTTP and `worker-bridge ui` share),
and what a served request makes is still collected; a bulk step pauses collections, and the
last of concurrent pauses out turns the collector back on only if it was on."""

from __future__ import annotations

import argparse
import gc
import threading
import weakref

import pytest

from bridge import WorkerBridge
from bridge.config.settings import HttpConfig
from bridge.host.heap import collections_paused, freeze_start_up_heap
from bridge.listener import run as listener_run
from bridge.listener.options import HttpOptions
from bridge.mcp import server as mcp_server


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process's heap goes back to the ordinary generations


def test_the_stdio_server_freezes_its_start_up_heap_before_it_serves(
    tmp_path, monkeypatch, unfrozen
):
    seen = {}

    class Server:
        def run(self, transport):
            seen["transport"] = transport
            seen["frozen"] = gc.get_freeze_count()

    monkeypatch.setattr(mcp_server, "build_server", lambda bridge: Server())
    monkeypatch.setattr(listener_run, "keep_recovering", lambda recover: None)
    monkeypatch.setattr(mcp_server, "_setup_logging", lambda bridge: None)  # the test's own
    args = argparse.Namespace(http=None, token_file=None, no_token=False)
    bridge = WorkerBridge(home=tmp_path / "home")
    try:
        assert gc.get_freeze_count() == 0
        assert mcp_server.run(args, bridge) == 0
    finally:
        bridge.close()
    assert seen["transport"] == "stdio"
    assert seen["frozen"] > 1000  # the modules, classes and validators start-up made


def test_the_http_listener_freezes_before_uvicorn_serves(monkeypatch, unfrozen):
    import uvicorn

    seen = {}

    def run(self):
        seen["frozen"] = gc.get_freeze_count()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    options = HttpOptions("127.0.0.1", 1, None, "none (--no-token)")
    app = lambda scope, receive, send: None  # noqa: E731 - never called
    assert listener_run.run_listener(app, options, HttpConfig()) == 0
    assert seen["frozen"] > 1000


def test_garbage_made_after_the_freeze_is_still_collected(unfrozen):
    freeze_start_up_heap()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the cyclic collector frees it
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None


def test_concurrent_pauses_turn_the_collector_back_on_when_the_last_ends():
    assert gc.isenabled()
    inside, leave = threading.Barrier(2), threading.Event()

    def pause() -> None:
        with collections_paused():
            inside.wait()
            leave.wait()

    other = threading.Thread(target=pause)
    other.start()
    with collections_paused():
        inside.wait()
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread is still inside
    leave.set()
    other.join()
    assert gc.isenabled()


def test_a_pause_leaves_a_collector_that_was_off_off():
    gc.disable()
    try:
        with collections_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_pause_ends_when_its_step_raises():
    with pytest.raises(RuntimeError):
        with collections_paused():
            raise RuntimeError("the step failed")
    assert gc.isenabled()


def test_a_pause_cut_short_by_a_signal_is_repaired_by_the_next(monkeypatch):
    """An interrupt between turning the collector off and counting the pause: the next pause
    turns it back on."""
    from bridge.host import heap

    monkeypatch.setattr(heap, "_ours", True)  # as `__enter__` leaves it when cut there
    gc.disable()
    try:
        with collections_paused():
            assert not gc.isenabled()
        assert gc.isenabled()
    finally:
        gc.enable()
