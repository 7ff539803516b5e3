"""A CLI that starts at once: what `worker-bridge --help` and the commands that only read
(`tasks show`, `tasks list`) load. Each runs in a fresh interpreter and reports the modules it
imported; the heavy ones (docker-py, aiohttp, the MCP SDK, uvicorn, pydantic-settings,
sqlite-utils, psutil) and the pipeline must not be among them. No timings here: the figures
are bench/cli_startup.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.tasks import mock_task, new_task

from bridge.cli import COMMANDS

# Run the CLI's main() in a new interpreter, then write the names of every module it loaded.
_DRIVER = (
    "import json, sys\n"
    "from bridge.cli import main\n"
    "try:\n"
    "    code = main(sys.argv[2:])\n"
    "except SystemExit as exc:  # --help\n"
    "    code = exc.code\n"
    "open(sys.argv[1], 'w').write(json.dumps({'code': code, 'modules': sorted(sys.modules)}))\n"
)
# Never at start-up: each is imported by the one command (or phase) that uses it.
HEAVY = (
    "docker",
    "requests",
    "aiohttp",
    "mcp",
    "uvicorn",
    "h11",
    "pydantic_settings",
    "sqlite_utils",
    "psutil",
    "tenacity",
    "yaml",
    "json5",
    "asyncio",
    "bridge.pipeline.runner",
    "bridge.sandbox.docker",
    "bridge.gateway",
    "bridge.workers",
    "bridge.jobs.coordinator",
    "bridge.mcp",
    "bridge.listener.run",
)


def loaded(home: Path, workdir: Path, *argv: str) -> tuple[int, list[str]]:
    report = workdir / "modules.json"
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    subprocess.run(
        [sys.executable, "-c", _DRIVER, str(report), *argv],
        env=env,
        capture_output=True,
        check=False,
        timeout=60,
    )
    found = json.loads(report.read_text())
    return found["code"], found["modules"]


def heavy_among(modules: list[str]) -> list[str]:
    return [m for m in modules if m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY))]


@pytest.fixture
def finished_task(home: Path, repo: Path) -> str:
    """A task run to its end through the fake backend: a result with files and checks."""
    from bridge import WorkerBridge
    from bridge.sandbox.fake import FakeSandbox

    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    try:
        spec = mock_task(repo, {"write": {"notes.txt": "hello\n"}}, verify=["true"])
        task_id = bridge.create_task(spec).task_id
        assert bridge.run_task(task_id).status == "succeeded"
        return task_id
    finally:
        bridge.close()


def test_help_loads_neither_the_facade_nor_pydantic(home, workdir):
    code, modules = loaded(home, workdir, "--help")
    assert code == 0
    assert heavy_among(modules) == []
    assert "pydantic" not in modules and "bridge.service" not in modules


def test_showing_and_listing_tasks_load_no_heavy_module(home, workdir, finished_task):
    for argv in (
        ("tasks", "show", finished_task),
        ("tasks", "show", finished_task, "--json"),
        ("tasks", "list"),
        ("tasks", "list", "--json"),
        ("jobs", "list"),
    ):
        code, modules = loaded(home, workdir, *argv)
        assert code == 0, argv
        assert heavy_among(modules) == [], argv


def test_a_plain_setting_in_the_environment_still_loads_without_pydantic_settings(
    home, workdir, finished_task, monkeypatch
):
    monkeypatch.setenv("WORKER_BRIDGE_MAX_CONCURRENCY", "2")
    code, modules = loaded(home, workdir, "tasks", "show", finished_task)
    assert code == 0
    assert "pydantic_settings" not in modules


def test_the_guard_sees_a_heavy_import(home, workdir):
    # `workers list` asks the engine: docker-py is loaded, and the check above would say so.
    _, modules = loaded(home, workdir, "workers", "list", "--json")
    assert "docker" in heavy_among(modules)


def test_every_command_names_a_function_that_exists():
    for command in COMMANDS:
        assert callable(command.function()), command.run


def test_a_follow_up_the_caller_waits_for_runs_in_the_callers_process(home, repo):
    from bridge import WorkerBridge
    from bridge.sandbox.fake import FakeSandbox

    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    try:
        mock = {"write": {"a.txt": "1\n"}, "on_follow_up": {"write": {"b.txt": "2\n"}}}
        task_id = bridge.create_task(mock_task(repo, mock, verify=["true"])).task_id
        assert bridge.run_task(task_id).status == "succeeded"
        result = bridge.follow_up(task_id, "also b", wait=True)
    finally:
        bridge.close()
    assert result.status == "succeeded"
    assert {c.path for c in result.changed_files} == {"a.txt", "b.txt"}
    assert not list((home / "logs").glob("runner-*.log"))  # no detached runner was started


def test_the_quick_exit_loses_no_output_and_keeps_the_exit_code(home, cli, monkeypatch):
    """The console script ends with os._exit after flushing: a listing far larger than a pipe's
    buffer arrives whole, in one write or a line at a time, and codes are kept."""
    from bridge.store import Store

    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # stdout buffered, as a pipe's is
    store = Store(home / "bridge.db")
    for n in range(300):
        store.insert_task(new_task(f"t{n:04d}", objective="o" * 500), {})
    store.close()
    for env in ({}, {"WORKER_BRIDGE_STORE": str(home / "bridge.db")}):
        listed = cli("tasks", "list", "--json", env=env)
        assert listed.code == 0, listed.stderr
        assert len(listed.stdout) > 150_000
        assert [t["task_id"] for t in listed.json()["tasks"]][-1] == "t0000"
        lines = cli("tasks", "list", env=env).stdout.splitlines()  # a print per task
        assert len(lines) == 300 and lines[-1].startswith("t0000")
        missing = cli("tasks", "show", "nope", env=env)
        assert missing.code == 2 and "No task 'nope'" in missing.stderr


def test_the_quick_exit_stops_idle_executor_threads_as_exit_does(workdir):
    """A thread pool left idle (its workers are not daemons) does not hold the process open."""
    script = (
        "import concurrent.futures, bridge.cli\n"
        "kept = []\n"
        "def main():\n"
        "    kept.append(concurrent.futures.ThreadPoolExecutor(1))  # still referenced at exit\n"
        "    kept[0].submit(print, 'ran').result()\n"
        "    return 3\n"
        "bridge.cli.main = main\n"
        "bridge.cli.run()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout) == (3, "ran\n")
