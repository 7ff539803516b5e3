"""The tests' own package indexes (tests/support/registries.py) and project generators
(tests/support/projects.py), with the real npm directly and through a forwarding HTTP proxy that
models the gateway (pip and the real gateway are exercised by
tests/environments/test_end_to_end.py).

What was seen of the clients when this was written (npm 11.19 on node 20.20, pip 23.2), and why
a setup container gets no NO_PROXY (bridge/environments/setup.py): both honour HTTP_PROXY for
http:// URLs with no config of their own, neither bypasses the proxy for `localhost` by itself,
but both do when NO_PROXY names `localhost`, so with the gateway's usual "127.0.0.1,localhost"
a `localhost` registry would be looked for on the container's own loopback."""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
from support.projects import NODE_DEP, bump_dependency, node_project, python_project
from support.registries import ForwardingProxy, PackageServer
from support.repos import git

NPM = shutil.which("npm")
needs_npm = pytest.mark.skipif(NPM is None, reason="npm is not installed")
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def proxy():
    with ForwardingProxy() as p:
        yield p


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with _DIRECT.open(request, timeout=10) as resp:
            return resp.status, resp.read(), resp.geturl()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), url


def tool_env(home: Path, **extra: str) -> dict[str, str]:
    """The host's environment without its proxy, npm and pip settings, HOME a fresh folder."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.lower().endswith("_proxy") and not k.lower().startswith(("npm_config_", "pip_"))
    }
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        npm_config_update_notifier="false",
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_CACHE_DIR="1",
        **extra,
    )
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{cmd} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


# -- the server itself ------------------------------------------------------------------------


def test_npm_packument_and_tarball(server):
    entry = server.add_npm("wb-x", "1.2.0", {"index.js": "module.exports = 1;\n"}, {"wb-y": "1"})
    server.add_npm("wb-x", "1.10.0", {"index.js": "module.exports = 2;\n"})
    tgz = f"{server.url}/wb-x/-/wb-x-1.2.0.tgz"
    assert entry["resolved"] == tgz and entry["version"] == "1.2.0"

    status, body, _ = fetch(f"{server.url}/wb-x")
    assert status == 200
    doc = json.loads(body)
    assert doc["name"] == "wb-x" and doc["dist-tags"]["latest"] == "1.10.0"  # numeric order
    v = doc["versions"]["1.2.0"]
    assert (v["name"], v["version"], v["dependencies"]) == ("wb-x", "1.2.0", {"wb-y": "1"})
    assert v["dist"]["tarball"] == tgz and v["dist"]["integrity"] == entry["integrity"]

    status, data, _ = fetch(tgz)
    assert status == 200
    assert (
        entry["integrity"] == "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    )
    assert v["dist"]["shasum"] == hashlib.sha1(data).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        assert sorted(tar.getnames()) == ["package/index.js", "package/package.json"]
        manifest = json.load(tar.extractfile("package/package.json"))
    assert manifest["name"] == "wb-x" and manifest["version"] == "1.2.0"

    # Publishing is deterministic: the same definition, the same bytes and integrity.
    again = server.add_npm("wb-x", "1.2.0", {"index.js": "module.exports = 1;\n"}, {"wb-y": "1"})
    assert again == entry
    assert fetch(f"{server.url}/wb-nothing")[0] == 404
    assert fetch(f"{server.url}/wb-x/-/wb-x-9.9.9.tgz")[0] == 404
    assert server.requests == [
        "/wb-x",
        "/wb-x/-/wb-x-1.2.0.tgz",
        "/wb-nothing",
        "/wb-x/-/wb-x-9.9.9.tgz",
    ]


def test_tarball_urls_follow_the_host_header_or_the_base_url(server):
    server.add_npm("wb-x", "1.0.0", {"index.js": ""})
    _, body, _ = fetch(f"{server.url}/wb-x", {"Host": f"registry.test:{server.port}"})
    tarball = json.loads(body)["versions"]["1.0.0"]["dist"]["tarball"]
    assert tarball == f"http://registry.test:{server.port}/wb-x/-/wb-x-1.0.0.tgz"

    with PackageServer(base_url="http://mirror.test/npm/") as fixed:
        entry = fixed.add_npm("wb-x", "1.0.0", {"index.js": ""})
        assert entry["resolved"] == "http://mirror.test/npm/wb-x/-/wb-x-1.0.0.tgz"
        _, body, _ = fetch(f"{fixed.url}/wb-x")
        assert json.loads(body)["versions"]["1.0.0"]["dist"]["tarball"] == entry["resolved"]


def test_simple_index_and_wheel(server):
    filename = server.add_wheel("Wb.Dep_Two", "1.0", {"wb_dep_two/__init__.py": "VALUE = 7\n"})
    assert filename == "wb_dep_two-1.0-py3-none-any.whl"
    assert server.has_wheel("wb-dep-two", "1.0") and not server.has_wheel("wb-dep-two", "2.0")

    status, body, _ = fetch(f"{server.url}/simple/")
    assert status == 200 and b'href="wb-dep-two/"' in body
    status, body, _ = fetch(f"{server.url}/simple/wb-dep-two/")
    assert status == 200
    (href,) = re.findall(r'href="([^"]+)"', body.decode())
    path, _, fragment = href.partition("#sha256=")
    assert path == f"../../files/{filename}"

    # A name as a user spells it is redirected to its normalised form (PEP 503).
    status, _, final = fetch(f"{server.url}/simple/Wb_Dep.Two/")
    assert status == 200 and final == f"{server.url}/simple/wb-dep-two/"
    assert fetch(f"{server.url}/simple/nothing-here/")[0] == 404

    status, data, _ = fetch(f"{server.url}/files/{filename}")
    assert status == 200 and hashlib.sha256(data).hexdigest() == fragment
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = "wb_dep_two-1.0.dist-info"
        assert zf.read("wb_dep_two/__init__.py") == b"VALUE = 7\n"
        assert b"Name: Wb.Dep_Two\nVersion: 1.0\n" in zf.read(f"{info}/METADATA")
        wheel = zf.read(f"{info}/WHEEL").decode()
        assert "Root-Is-Purelib: true" in wheel and "Tag: py3-none-any" in wheel
        rows = list(csv.reader(io.StringIO(zf.read(f"{info}/RECORD").decode())))
        assert {r[0] for r in rows} == set(zf.namelist())
        for path, digest, size in rows:
            if path.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            content = zf.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=")
            assert digest == f"sha256={expected.decode()}" and int(size) == len(content)
    assert f"/files/{filename}" in server.requests
    server.clear_requests()
    assert server.requests == []


def test_forwarding_proxy_forwards_absolute_uris_only(server, proxy):
    server.add_npm("wb-x", "1.0.0", {"index.js": ""})
    via = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy.url}))
    with via.open(f"{server.url}/wb-x", timeout=10) as resp:
        assert json.loads(resp.read())["name"] == "wb-x"
    assert proxy.requests == [f"GET {server.url}/wb-x"]
    assert server.requests == ["/wb-x"]
    assert fetch(f"{proxy.url}/wb-x")[0] == 405  # origin-form: not a proxy request


# -- the generated projects -------------------------------------------------------------------


def test_node_project_is_committed_and_bump_leaves_it_alone(workdir, server):
    repo = node_project(workdir / "node", server)
    assert git(repo, "status", "--porcelain") == ""
    tracked = set(git(repo, "ls-files").split())
    assert {"package.json", "package-lock.json", "index.js", "test.js", ".gitignore"} <= tracked
    assert ".npmrc" not in tracked
    assert (repo / ".gitignore").read_text() == "node_modules/\n"
    package = json.loads((repo / "package.json").read_text())
    assert package["scripts"] == {"test": "node test.js"}
    assert package["dependencies"] == {NODE_DEP: "1.0.0"}
    lock = json.loads((repo / "package-lock.json").read_text())
    assert lock["lockfileVersion"] == 3
    assert lock["packages"][""]["dependencies"] == {NODE_DEP: "1.0.0"}
    dep = lock["packages"][f"node_modules/{NODE_DEP}"]
    assert dep["resolved"] == f"{server.url}/{NODE_DEP}/-/{NODE_DEP}-1.0.0.tgz"
    assert dep["integrity"].startswith("sha512-") and dep["version"] == "1.0.0"

    files = bump_dependency(repo, server, "2.0.0")
    assert set(files) == {"package.json", "package-lock.json"}
    assert git(repo, "status", "--porcelain") == ""  # a mock worker writes them, not this
    assert json.loads(files["package.json"])["dependencies"] == {NODE_DEP: "2.0.0"}
    new_lock = json.loads(files["package-lock.json"])
    assert new_lock["packages"][f"node_modules/{NODE_DEP}"]["version"] == "2.0.0"
    assert server.has_npm(NODE_DEP, "2.0.0")

    bump_dependency(repo, server, "2.0.0", write=True)
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "package-lock.json").read_text() == files["package-lock.json"]


def test_python_project_is_committed(workdir, server):
    repo = python_project(workdir / "py", server)
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "requirements.txt").read_text() == "wbdep==1.0\n"
    assert set(git(repo, "ls-files").split()) >= {"calc.py", "tests/test_calc.py", ".gitignore"}
    assert ".venv/" in (repo / ".gitignore").read_text()
    assert server.has_wheel("wbdep", "1.0")


# -- npm, for real ----------------------------------------------------------------------------


def _npm_ci(repo: Path, env: dict[str, str]) -> None:
    shutil.rmtree(repo / "node_modules", ignore_errors=True)
    run([NPM, "ci", "--no-audit", "--no-fund"], repo, env)


@needs_npm
def test_npm_ci_and_test(workdir, server):
    repo = node_project(workdir / "node", server)
    env = tool_env(workdir / "home", npm_config_registry=f"{server.url}/")
    _npm_ci(repo, env)
    out = run([NPM, "test"], repo, env).stdout
    assert f"ok: {NODE_DEP} 1.0.0" in out
    assert f"/{NODE_DEP}/-/{NODE_DEP}-1.0.0.tgz" in server.requests

    # A bumped dependency installs from the new lockfile; a broken dependency fails `npm test`.
    bump_dependency(repo, server, "1.1.0", write=True)
    _npm_ci(repo, env)
    assert f"ok: {NODE_DEP} 1.1.0" in run([NPM, "test"], repo, env).stdout
    (repo / "node_modules" / NODE_DEP / "index.js").write_text("module.exports = () => '';\n")
    failed = subprocess.run([NPM, "test"], cwd=repo, env=env, capture_output=True, timeout=60)
    assert failed.returncode != 0


@needs_npm
def test_npm_install_resolves_from_the_packument_through_the_proxy(workdir, server, proxy):
    repo = node_project(workdir / "node", server)
    bump_dependency(repo, server, "1.3.0")  # published, so `latest` is 1.3.0
    env = tool_env(workdir / "home", npm_config_registry=f"{server.url}/", HTTP_PROXY=proxy.url)
    run([NPM, "install", "--no-audit", "--no-fund", f"{NODE_DEP}@latest"], repo, env)
    installed = json.loads((repo / "node_modules" / NODE_DEP / "package.json").read_text())
    assert installed["version"] == "1.3.0"
    assert f"GET {server.url}/{NODE_DEP}" in proxy.requests
    assert f"GET {server.url}/{NODE_DEP}/-/{NODE_DEP}-1.3.0.tgz" in proxy.requests
    assert "ok: wb-left-pad 1.3.0" in run([NPM, "test"], repo, env).stdout


# -- pip, for real ----------------------------------------------------------------------------


def _pip_install(venv: Path, repo: Path, server: PackageServer, env: dict[str, str]) -> None:
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--force-reinstall"]
    index = ["--index-url", f"{server.url}/simple", "--trusted-host", "localhost"]
    run([*pip, *index, "-r", "requirements.txt"], repo, env)
    check = "import wbdep, calc; assert calc.answer() == 42, calc.answer()"
    run([str(venv / "bin" / "python"), "-c", check], repo, env)
