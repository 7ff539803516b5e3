"""The live view of `tasks run` / `start --wait`: the phase and the worker's progress as they
happen, on standard error, with nothing a worker wrote able to drive the terminal."""

from __future__ import annotations

import io
import json

from support.tasks import task_flags
from support.waiting import poll

from bridge.cli.live import LiveView, describe
from bridge.records import Event, EventPage


class FakeBridge:
    """Just what the view reads: a task's events and its status."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(self, kind: str, data: dict) -> None:
        self.events.append(event(kind, data, len(self.events) + 1))

    def task_logs(self, task_id: str, after: int = 0, limit: int = 200) -> EventPage:
        page = [e for e in self.events if e.event_id > after][:limit]
        return EventPage(events=page, next_after=page[-1].event_id if page else after)

    def task_state(self, task_id: str) -> tuple[str, str | None]:
        return "running", "worker"


def event(kind: str, data: dict, event_id: int = 1) -> Event:
    return Event(event_id=event_id, task_id="t1", kind=kind, at="2026-01-01T00:00:00Z", data=data)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_kind_and_tool_and_what_workers_wrote_cannot_drive_the_terminal():
    bridge, out = FakeBridge(), Tty()
    with LiveView(bridge, "t1", stream=out) as view:
        view.start()
        bridge.add("worker.started", {"worker": "codex", "turn": 0})
        bridge.add("worker.progress", {"kind": "tool", "text": "/workspace/a.py", "name": "Write"})
        bridge.add(
            "worker.progress", {"kind": "message", "text": "evil\x1b[2J\nfake line", "name": None}
        )
        poll(lambda: "\r\x1b[K[running · worker" in out.getvalue(), "the status line")
    shown = out.getvalue()
    assert "worker codex started" in shown
    assert "  tool Write: /workspace/a.py" in shown
    assert "evil\\x1b[2J\\nfake line" in shown  # escaped, on one line
    assert "\x1b[2J" not in shown
    assert shown.endswith("\r\x1b[K") or shown.endswith("\n")  # the status line is cleared


def test_into_a_pipe_only_plain_lines():
    bridge, out = FakeBridge(), io.StringIO()
    bridge.add("verification.command", {"command": "pytest -q", "exit_code": 1, "status": "failed"})
    with LiveView(bridge, "t1", stream=out) as view:
        view.start()
    assert out.getvalue() == "  check `pytest -q`: failed\n"


def test_a_view_this_process_never_started_shows_nothing():
    """`start --wait` refused, or another process claimed the task first: that run's events
    are not this command's to show."""
    bridge, out = FakeBridge(), Tty()
    bridge.add("worker.started", {"worker": "mock", "turn": 0})
    with LiveView(bridge, "t1", stream=out):
        bridge.add("worker.progress", {"kind": "message", "text": "theirs", "name": None})
    assert out.getvalue() == ""


def test_events_not_worth_showing_live_are_left_out():
    assert describe(event("workspace.ready", {})) is None
    line = describe(event("worker.progress", {"line": "an old event"}))
    assert line == "  an old event"


def test_tasks_run_shows_progress_on_stderr_and_keeps_stdout_for_the_result(
    docker_images, cli, repo
):
    mock = {"write": {"a.txt": "x"}, "script": "echo step-one-done"}
    flags = task_flags(repo, "live", metadata={"mock": mock})
    res = cli("tasks", "run", *flags)
    assert res.code == 0, res.stderr
    assert "step-one-done" in res.stderr and "worker mock started" in res.stderr
    assert res.stdout.startswith("task ") and "step-one-done" not in res.stdout
    quiet = cli("tasks", "run", *flags, "--json")
    assert quiet.code == 0 and quiet.stderr == ""
    json.loads(quiet.stdout)


def test_a_setup_shows_its_commands_and_output_and_cannot_drive_the_terminal():
    bridge, out = FakeBridge(), io.StringIO()
    bridge.add(
        "environment.setup",
        {"status": "started", "reason": "no cache entry", "commands": ["npm ci"]},
    )
    bridge.add("environment.output", {"text": "added 1 package\x1b[2J", "command": "npm ci"})
    bridge.add("environment.setup", {"status": "command", "command": "npm ci", "exit_code": 0})
    bridge.add("environment.setup", {"status": "completed", "duration_s": 1.5})
    bridge.add("environment.cached", {"key": "k"})
    with LiveView(bridge, "t1", stream=out) as view:
        view.start()
    assert out.getvalue().splitlines() == [
        "environment setup (no cache entry): 1 command(s)",
        "  added 1 package\\x1b[2J",
        "  setup `npm ci`: exit 0",
        "environment ready in 1.5 s",
        "environment from the cache",
    ]


def test_a_request_is_shown_whole_so_a_long_name_cannot_hide_where_it_leads():
    """A worker asks for `files.pythonhosted.org.<padding>.evil.example`: cut at the view's
    width, the caller would see a trusted name and approve the attacker's domain."""
    host = "files.pythonhosted.org." + ".".join(["a" * 60] * 3) + ".evil.example"
    assert len(host) <= 253
    bridge, out = FakeBridge(), io.StringIO()
    detail = {"host": host, "port": 443}
    bridge.add("task.request", {"request_id": "r1", "kind": "network", "detail": detail})
    with LiveView(bridge, "t1", stream=out) as view:
        view.start()
    shown = out.getvalue()
    assert f"reach {host}:443" in shown and "tasks answer t1 r1" in shown
    assert shown.count("\n") == 1  # still one line


def test_a_follow_up_waited_for_shows_its_turn_live(docker_images, cli, repo):
    mock = {"write": {"a.txt": "x"}, "on_follow_up": {"script": "echo second-turn-done"}}
    flags = task_flags(repo, "live", metadata={"mock": mock})
    task_id = cli("tasks", "run", *flags, "--json").json()["task_id"]
    res = cli("tasks", "follow-up", task_id, "once more", "--wait")
    assert res.code == 0, res.stderr
    assert "second-turn-done" in res.stderr and "worker mock started" in res.stderr
    assert "second-turn-done" not in res.stdout
