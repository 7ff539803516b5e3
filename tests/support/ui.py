"""The web view for the tests: `worker-bridge ui` on a free loopback port until its login page
answers, always stopped by its pid; an HTTP client signed in the way a browser is (the token
posted to the login for the session cookie and the key in the redirect's fragment, the key
then sent with every request); Debian's chromium
driven by Playwright (never a downloaded browser), and where screenshots go."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from support.cli import CLI
from support.mcp_http_server import on_free_port, serving
from support.scratch import TEST_ROOT

REQUIRE_BROWSER = os.environ.get("WORKER_BRIDGE_REQUIRE_BROWSER") == "1"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("WORKER_BRIDGE_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts")


@dataclass
class UiServer:
    proc: subprocess.Popen
    url: str  # http://127.0.0.1:PORT
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def ui_server(home: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[UiServer]:
    """`worker-bridge ui --listen 127.0.0.1:PORT ARGS...` against HOME until its login page
    answers; stopped by its pid (SIGTERM, then SIGKILL) on the way out."""
    full_env = {**os.environ, "WORKER_BRIDGE_HOME": str(home), **(env or {})}

    def start(port: int) -> UiServer:
        log_path = home.parent / f"ui-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [*CLI, "ui", "--listen", f"127.0.0.1:{port}", *args],
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        return UiServer(proc, f"http://127.0.0.1:{port}", log_path)

    with serving(on_free_port(start, _answers), _answers, "the ui") as running:
        yield running


def _answers(url: str) -> bool:
    try:
        return httpx2.get(f"{url}/ui/login", timeout=2).status_code in (200, 303)
    except httpx2.HTTPError:
        return False


@dataclass
class SignedIn:
    client: httpx2.Client  # sends the key with every request, as the page does
    key: str
    origin: str

    def act(self, path: str, body: dict | None = None, **headers: str) -> httpx2.Response:
        """An action as the page sends it: its Origin and the session's key."""
        sent = {"origin": self.origin, **headers}
        return self.client.post(path, json=body or {}, headers=sent)

    def cookie_only(self) -> httpx2.Client:
        """A client with this session's cookie but not its key (what a page on another
        loopback port may get hold of: cookies are not isolated by port)."""
        other = httpx2.Client(base_url=self.origin, timeout=30)
        for cookie in self.client.cookies.jar:
            other.cookies.set(cookie.name, cookie.value, path=cookie.path)
        return other


def log_in(client: httpx2.Client, url: str, token: str) -> str:
    """POST the token as the login form does; the session's key from the redirect."""
    login = client.post("/ui/login", data={"token": token}, headers={"origin": url})
    assert login.status_code == 303, login.text
    location = login.headers["location"]
    assert location.startswith("/ui/#k="), location
    return location.removeprefix("/ui/#k=")


@contextmanager
def signed_in(url: str, token: str) -> Iterator[SignedIn]:
    with httpx2.Client(base_url=url, timeout=30) as client:
        key = log_in(client, url, token)
        client.headers["x-ui-key"] = key
        yield SignedIn(client, key, url)


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def launch_browser():
    """Playwright's chromium driver on Debian's chromium, headless; skipped (failed under
    WORKER_BRIDGE_REQUIRE_BROWSER=1) when either is missing. Returns (playwright, browser)."""
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    path = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        path = None
    if path is None:
        why = "the browser tests need Playwright (pip) and chromium (apt-get install chromium)"
        if REQUIRE_BROWSER:
            pytest.fail(f"WORKER_BRIDGE_REQUIRE_BROWSER=1 but: {why}")
        pytest.skip(why)
    playwright = sync_playwright().start()
    try:
        # No sandbox of chromium's own: it cannot make one as root in a container.
        browser = playwright.chromium.launch(
            executable_path=path, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
    except Exception:
        playwright.stop()
        raise
    return playwright, browser


def screenshot(page, name: str) -> Path:
    """A full-page screenshot into the test artifacts (and, with WORKER_BRIDGE_UPDATE_DOCS=1,
    into docs/ when NAME is one the docs show: docs/ui.md)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("WORKER_BRIDGE_UPDATE_DOCS") == "1" and name in ("ui-job",):
        shutil.copyfile(path, ROOT / "docs" / f"{name}.png")
    return path


@dataclass
class Site:
    """One state root, repository and `worker-bridge ui` shared by a test module (each test
    makes its own tasks in it); ``bridge`` is the library on the same state root."""

    server: UiServer
    home: Path
    repo: Path
    token: str
    token_file: Path
    bridge: object

    @property
    def url(self) -> str:
        return self.server.url


@contextmanager
def shared_site(factory: pytest.TempPathFactory) -> Iterator[Site]:
    """A Site in a folder of its own (under TEST_ROOT, else pytest's base temp); on the way
    out every unfinished task is cancelled (which kills its containers), the state root's
    containers removed and the folder too."""
    import secrets

    from support.engine import remove_home_artifacts
    from support.mcp_session import cancel_unfinished
    from support.repos import calc_repo

    from bridge import WorkerBridge
    from bridge.workspace.fs import remove_tree
    from bridge.workspace.overlay import unmount_under
    from bridge.workspace.trash import reap

    workdir = (TEST_ROOT or factory.getbasetemp()) / f"wb-ui-{uuid.uuid4().hex[:10]}"
    home = workdir / "home"
    home.mkdir(parents=True)
    repo = calc_repo(workdir / "repo")
    token = secrets.token_hex(24)
    token_file = workdir / "ui-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    bridge = WorkerBridge(home=home)
    try:
        with ui_server(home, "--token-file", str(token_file)) as server:
            yield Site(server, home, repo, token, token_file, bridge)
    finally:
        bridge.close()
        cancel_unfinished(home)
        remove_home_artifacts(home)
        reap(home)
        unmount_under(workdir)  # the tasks' layered worktrees (never pruned here)
        remove_tree(workdir)


def file_diff(name: str, lines: int, pad: int = 0) -> bytes:
    """A git diff adding file NAME of LINES lines (each PAD characters longer)."""
    body = "".join(f"+line {n} of {name}{'.' * pad}\n" for n in range(lines))
    return (
        f"diff --git a/{name} b/{name}\nnew file mode 100644\n--- /dev/null\n+++ b/{name}\n"
        f"@@ -0,0 +1,{lines} @@\n{body}"
    ).encode()


def big_diff_task(site) -> tuple[str, bytes, bytes]:
    """A created task whose diff artifact is two files of about 5 and 4 MiB (in long lines, a
    few thousand of them: a page draws them in reasonable time): over the 8 MiB cap."""
    from support.tasks import bare_spec

    task_id = site.bridge.create_task(bare_spec(site.repo)).task_id
    first, second = file_diff("a.txt", 5 * 512, 2000), file_diff("b.txt", 4 * 512, 2000)
    path = site.home.parent / f"{task_id}.diff"
    path.write_bytes(first + second)
    digest = hashlib.sha256(first + second).hexdigest()
    site.bridge.store.add_artifact(task_id, "diff", path, len(first + second), digest)
    return task_id, first, second
