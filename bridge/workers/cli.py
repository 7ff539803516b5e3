"""What the built-in coding CLIs (Claude Code, Codex, OpenCode, zcode-glm) share: their own
pinned image, one model route of the gateway (the real key is added on the host; the sandbox
gets a placeholder), a model from config or the task's metadata, a native session that later
turns resume, and a JSON stream read one line at a time."""

from __future__ import annotations

import json

from bridge.config.settings import Config, WorkerSettings
from bridge.models import JsonObject
from bridge.workers.base import ParsedLine, Worker

ROUTES_URL = "http://127.0.0.1:7800"  # the gateway's model routes, inside the sandbox
# What the sandbox holds instead of a credential: the gateway drops it and adds the real key.
PLACEHOLDER_KEY = "worker-bridge-placeholder"
UUID_PATTERN = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


class CliWorker(Worker):
    """A built-in CLI. Subclasses set the names and build the command line and the parser."""

    image_name: str  # images/<image_name>
    default_route: str
    default_model: str | None = None
    capabilities = ("write", "follow_up", "resume", "read_only")
    resumes_sessions = True

    def image(self, config: Config) -> str:
        return config.image_for(self.image_name)

    @property
    def build_target(self) -> str | None:
        return self.image_name

    def settings(self, config: Config) -> WorkerSettings:
        return config.worker_settings.get(self.name) or WorkerSettings()

    def route(self, config: Config) -> str:
        return self.settings(config).route or self.default_route

    def route_url(self, config: Config) -> str:
        return f"{ROUTES_URL}/{self.route(config)}"

    def model(self, metadata: JsonObject, config: Config) -> str | None:
        chosen = metadata.get("model")
        return str(chosen) if chosen else (self.settings(config).model or self.default_model)

    # The host variable with the route's real key, named when the provider refuses it. Learnt
    # by `learn_key_env` in launch (parse_line gets no config; the pipeline calls launch on the
    # same worker before it reads the turn's output, an adopted container included).
    key_env: str = "the key variable of the worker's gateway route"

    def learn_key_env(self, config: Config) -> None:
        from bridge.gateway.policy import all_routes

        route = all_routes(config).get(self.route(config))
        if route is not None and route.key_env:
            self.key_env = route.key_env

    def routes(self, metadata: JsonObject, config: Config) -> list[str]:
        return [self.route(config)]

    def health(self, config: Config) -> str | None:
        from bridge.errors import InvalidSpec
        from bridge.gateway.policy import check_routes

        try:
            check_routes(config, [self.route(config)])
        except InvalidSpec as exc:
            return exc.message
        return None

    def check_metadata(self, metadata: JsonObject, config: Config) -> None:
        from bridge.errors import InvalidSpec

        model = metadata.get("model")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise InvalidSpec("metadata.model must be a model name (a non-empty string).")


def json_line(line: str) -> JsonObject | None:
    """The JSON object on ``line``, or None (a CLI's stream may carry plain lines too)."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def plain(line: str) -> ParsedLine:
    """A line that is not part of the JSON stream: progress text, nothing more."""
    return ParsedLine.message(line) if line.strip() else ParsedLine()
