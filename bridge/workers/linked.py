"""A command-line agent linked with `worker-bridge workers link`: argv with '{prompt}' filled in."""

from __future__ import annotations

from bridge.config.settings import Config, LinkedWorker
from bridge.workers.base import INPUTS_DIR, ParsedLine, Turn, Worker, WorkerLaunch


class LinkedCliWorker(Worker):
    capabilities = ("follow_up",)

    def __init__(self, name: str, spec: LinkedWorker) -> None:
        self.name = name
        self.spec = spec

    def image(self, config: Config) -> str:
        return self.spec.image or config.image_for("base")

    @property
    def build_target(self) -> str | None:
        return "base" if self.spec.image is None else None

    def launch(self, turn: Turn, config: Config) -> WorkerLaunch:
        prompt = turn.prompt
        command = [part.replace("{prompt}", prompt) for part in self.spec.command]
        return WorkerLaunch(
            command=command,
            env={"WB_PROMPT_FILE": f"{INPUTS_DIR}/prompt.txt"},
            files={"prompt.txt": prompt},
        )

    def routes(self, metadata: dict, config: Config) -> list[str]:
        return list(self.spec.routes)

    def health(self, config: Config) -> str | None:
        from bridge.errors import InvalidSpec
        from bridge.gateway.policy import check_routes

        try:
            check_routes(config, self.routes({}, config))
        except InvalidSpec as exc:
            return exc.message
        return None

    def parse_line(self, line: str) -> ParsedLine:
        # A plain CLI's last non-empty line is its final message.
        return ParsedLine.message(line, summary=line if line.strip() else None)
