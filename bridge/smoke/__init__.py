"""`worker-bridge images build --smoke`: after building, run one real task in each worker image
(the mock worker's task; each CLI against the scripted model server on loopback, through its
task's gateway, with a throwaway key), so a pipeline knows the images it built can do the job,
not only start. Each smoke task has its own state root and repository, removed afterwards."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bridge.config.settings import Config, RouteConfig

KEY_VAR = "WORKER_BRIDGE_SMOKE_KEY"
# What each image's smoke runs: the workers that use it.
WORKERS_BY_IMAGE = {
    "mock": ["mock"],
    "claude-code": ["claude-code", "zcode-glm"],
    "codex": ["codex"],
    "opencode": ["opencode"],
}
OBJECTIVE = "Write the smoke file.\n@write smoke.txt: smoke ok\n@say Smoke test done."


@dataclass
class SmokeResult:
    worker: str
    ok: bool
    seconds: float
    detail: str

    def line(self) -> str:
        mark = "ok" if self.ok else "FAILED"
        return f"smoke {self.worker:<12} {mark:<6} {self.seconds:6.1f} s  {self.detail}"


def smoke_workers(images: list[str]) -> list[str]:
    return [w for image in images for w in WORKERS_BY_IMAGE.get(image, [])]


def run_smoke(
    config: Config, workers: list[str], on_line: Callable[[str], None] = print
) -> list[SmokeResult]:
    """One task per worker; the results (never raises for a failed task)."""
    from bridge.smoke.model_server import ModelServer

    key = "sk-smoke-" + os.urandom(8).hex()
    server = ModelServer(key=key).start()
    previous = os.environ.get(KEY_VAR)
    os.environ[KEY_VAR] = key  # read by the task's gateway, in this process
    results = []
    try:
        routes = _smoke_routes(config, workers, server.url)
        for worker in workers:
            result = _one(config, worker, routes, server)
            on_line(result.line())
            results.append(result)
    finally:
        server.stop()
        if previous is None:
            os.environ.pop(KEY_VAR, None)
        else:
            os.environ[KEY_VAR] = previous
    return results


def _smoke_routes(config: Config, workers: list[str], url: str) -> dict[str, RouteConfig]:
    """Every route the workers use, led to the scripted server with the throwaway key (each
    keeps its own way of sending the key, which its CLI expects)."""
    from bridge.gateway.policy import all_routes
    from bridge.workers import get_worker

    known = all_routes(config)
    names = {r for w in workers for r in get_worker(config, w).routes({}, config)}
    return {
        name: RouteConfig(
            upstream=url, auth=known[name].auth if name in known else None, key_env=KEY_VAR
        )
        for name in sorted(names)
    }


def _one(config: Config, worker: str, routes: dict, server) -> SmokeResult:
    from bridge.service import WorkerBridge
    from bridge.workspace import fs

    root = Path(tempfile.mkdtemp(prefix=f"wb-smoke-{worker}-", dir=_scratch()))
    started = time.monotonic()
    gateway = config.gateway.model_copy(update={"routes": routes})
    smoke_config = config.model_copy(
        update={"home": root / "home", "store": None, "gateway": gateway}
    )
    bridge = WorkerBridge(smoke_config)
    try:
        repo = _repository(root / "repo")
        spec = {
            "objective": OBJECTIVE,
            "worker": worker,
            "workspace": {"repository": str(repo)},
            "verification": {"commands": ["grep -q 'smoke ok' smoke.txt"]},
            "limits": {"timeout_seconds": 300},
        }
        if worker == "mock":
            spec["metadata"] = {"mock": {"write": {"smoke.txt": "smoke ok\n"}}}
        seen = len(server.requests)
        result = bridge.run_task(bridge.create_task(spec).task_id)
        requests = len(server.requests) - seen
        ok = result.status == "succeeded" and (worker == "mock" or requests > 0)
        detail = f"verified, {requests} model requests" if ok else _why(result.document(), requests)
        return SmokeResult(worker, ok, time.monotonic() - started, detail)
    except Exception as exc:  # a smoke run reports, it does not stop the others
        return SmokeResult(worker, False, time.monotonic() - started, str(exc)[:300])
    finally:
        from bridge.sandbox.spec import home_id

        try:
            bridge.sandbox.remove_by_labels({"io.worker-bridge.home": home_id(root / "home")})
        except Exception:
            pass
        bridge.close()
        from bridge.workspace.overlay import unmount_under

        unmount_under(root)  # its layered worktree stays mounted until pruned: not here
        fs.remove_tree(root)


def _why(result: dict, requests: int) -> str:
    error = result.get("error") or {}
    if error:
        return f"{result['status']}: {error.get('message', '')}"[:300]
    return f"{result['status']} with {requests} model requests"


def _repository(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README.md").write_text("smoke test repository\n")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "worker-bridge",
        "GIT_AUTHOR_EMAIL": "smoke@worker-bridge.invalid",
        "GIT_COMMITTER_NAME": "worker-bridge",
        "GIT_COMMITTER_EMAIL": "smoke@worker-bridge.invalid",
    }
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "smoke"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, env=env, capture_output=True)
    return path


def _scratch() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else None
