"""The deterministic `mock` worker: performs what `metadata.mock` says (see images/mock)."""

from __future__ import annotations

import json

from bridge.config.settings import Config
from bridge.errors import InvalidSpec
from bridge.workers.base import INPUTS_DIR, ParsedLine, Turn, Worker, WorkerLaunch

_KEYS = {"write", "delete", "script", "sleep", "exit_code", "summary", "on_follow_up", "routes"}


def check_mock_metadata(metadata: dict, config: Config) -> None:
    mock = metadata.get("mock", {})
    if not isinstance(mock, dict):
        raise InvalidSpec("metadata.mock must be an object; see the mock worker in the contract.")
    for where, actions in (
        ("metadata.mock", mock),
        ("metadata.mock.on_follow_up", mock.get("on_follow_up") or {}),
    ):
        unknown = sorted(set(actions) - _KEYS)
        if unknown:
            raise InvalidSpec(f"Unknown key '{where}.{unknown[0]}' for the mock worker.")
        if not isinstance(actions.get("write", {}), dict):
            raise InvalidSpec(f"{where}.write must map paths to file contents.")
        if not isinstance(actions.get("delete", []), list):
            raise InvalidSpec(f"{where}.delete must be a list of paths.")
    routes = mock.get("routes", [])
    if not isinstance(routes, list) or not all(isinstance(r, str) for r in routes):
        raise InvalidSpec("metadata.mock.routes must be a list of gateway route names.")
    if routes and not config.allow_mock_routes:
        raise InvalidSpec(
            "metadata.mock.routes is refused here: it would give the task's script a model "
            "route with the host's key; the owner can allow it with `allow_mock_routes: true` "
            "in config.yaml."
        )


class MockWorker(Worker):
    name = "mock"
    capabilities = ("write", "delete", "script", "follow_up", "read_only")
    probe = ("python3", "--version")  # mock-worker is a python3 script

    def image(self, config: Config) -> str:
        return config.image_for("mock")

    def launch(self, turn: Turn, config: Config) -> WorkerLaunch:
        mock = turn.metadata.get("mock") or {}
        chosen = mock if turn.number == 0 else (mock.get("on_follow_up") or {})
        actions = {k: v for k, v in chosen.items() if k not in ("on_follow_up", "routes")}
        return WorkerLaunch(
            command=["mock-worker"],
            env={"WB_MOCK_FILE": f"{INPUTS_DIR}/mock.json"},
            files={"mock.json": json.dumps(actions), "prompt.txt": turn.prompt},
        )

    def routes(self, metadata: dict, config: Config) -> list[str]:
        # The mock declares no model route unless told to (the gateway tests do), and only
        # where the owner allows it (the task's recorded config; a later turn is refused by the
        # facade once the owner's live config no longer allows it, creation.recheck_permissions).
        if not config.allow_mock_routes:
            return []
        return list((metadata.get("mock") or {}).get("routes") or [])

    def can_repair(self, metadata: dict) -> bool:
        # The mock only acts on a later turn through on_follow_up; without it a repair is moot.
        return bool((metadata.get("mock") or {}).get("on_follow_up"))

    def parse_line(self, line: str) -> ParsedLine:
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                return ParsedLine.message(line)
            if event.get("type") == "result":
                return ParsedLine(summary=str(event.get("summary", "")))
            if event.get("type") == "progress":
                return ParsedLine.message(str(event.get("message", "")))
        return ParsedLine.message(line)

    def check_metadata(self, metadata: dict, config: Config) -> None:
        check_mock_metadata(metadata, config)
