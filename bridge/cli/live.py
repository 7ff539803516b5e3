"""What `tasks run` and `tasks start --wait` show while a task runs: its phase and the worker's
progress as they happen, on standard error (standard output keeps the result alone). On a
terminal, events print as compact lines under a status line that
is redrawn in place (phase, elapsed time); into a pipe or a file, plain lines only. Everything
a worker wrote goes through `terminal_safe` and `one_line`: it cannot move the cursor or start
lines of its own."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from bridge.display import describe, one_line, terminal_safe
from bridge.service import WorkerBridge

POLL_S = 0.3
WIDTH = 160  # characters of one shown line
# Shown whole, however long (bounded by what a request may hold): cut, a request for
# `files.pythonhosted.org.<padding>.evil.example` would show a trusted name to approve.
WHOLE = ("task.request",)


class LiveView:
    """Follows one task in a background thread, from `start` (once this process runs the
    task) until the `with` ends."""

    def __init__(self, bridge: WorkerBridge, task_id: str, stream: TextIO | None = None) -> None:
        self.bridge = bridge
        self.task_id = task_id
        # The raw stream under the CLI's SafeStream: the view's own cursor codes must reach the
        # terminal; what the worker wrote is made safe line by line in _print.
        self.stream: TextIO = stream or getattr(sys.stderr, "stream", None) or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.cursor = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="live-view", daemon=True)
        self._started = time.monotonic()
        self._status_shown = False

    def __enter__(self) -> LiveView:
        return self

    def start(self) -> None:
        self._thread.start()

    def __exit__(self, *exc: object) -> None:
        if not self._thread.is_alive():
            return  # never started: another process ran the task, its events are not ours
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll()  # what happened after the last poll
        self._clear_status()
        self.stream.flush()

    def _follow(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._poll()
                self._draw_status()
            except Exception:  # a live view never breaks the run it shows
                pass

    def _poll(self) -> None:
        while True:
            page = self.bridge.task_logs(self.task_id, after=self.cursor, limit=200)
            for event in page.events:
                line = describe(event)
                if line is not None:
                    self._print(line, whole=event.kind in WHOLE)
            self.cursor = page.next_after
            if len(page.events) < 200:
                return

    def _print(self, line: str, whole: bool = False) -> None:
        self._clear_status()
        shown = terminal_safe(one_line(line))
        self.stream.write((shown if whole else shown[:WIDTH]) + "\n")
        self.stream.flush()

    def _draw_status(self) -> None:
        if not self.tty:
            return
        status, phase = self.bridge.task_state(self.task_id)
        elapsed = int(time.monotonic() - self._started)
        where = f"{status} · {phase}" if phase and status in ("running", "verifying") else status
        self.stream.write(f"\r\x1b[K[{where} · {elapsed} s]")
        self.stream.flush()
        self._status_shown = True

    def _clear_status(self) -> None:
        if self.tty and self._status_shown:
            self.stream.write("\r\x1b[K")
            self._status_shown = False
