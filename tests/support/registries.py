"""Package indexes the tests serve themselves, so no test depends on a public registry: an npm
registry and a PEP 503 simple index on the host's loopback, from in-memory definitions, plus a
tiny forwarding HTTP proxy that models the gateway's path to them.

    with PackageServer() as server:
        lock = server.add_npm("wb-left-pad", "1.0.0", {"index.js": "module.exports = 1;\n"})
        wheel = server.add_wheel("wbdep", "1.0", {"wbdep/__init__.py": "VALUE = 42\n"})
        ...  # npm_config_registry=f"{server.url}/", pip --index-url f"{server.url}/simple"
        assert f"/files/{wheel}" in server.requests

npm:  GET /<name>                         packument (JSON)
      GET /<name>/-/<name>-<version>.tgz  the tarball (files under package/)
pip:  GET /simple/                        the project list
      GET /simple/<normalised name>/      links ../../files/<wheel>#sha256=...
      GET /files/<wheel>                  a pure-Python wheel built in memory

The server binds 127.0.0.1 only, but its URLs name the host `localhost` (the gateway's allowlist
matches names; tests allowlist `localhost` with the trusted range 127.0.0.0/8). A client that
resolves `localhost` to ::1 first must fall back to 127.0.0.1 (node 20, pip and aiohttp try
each address in turn; /etc/hosts here maps `localhost` to 127.0.0.1 only).
"""

from __future__ import annotations

import asyncio
import base64
import csv
import gzip
import hashlib
import html
import io
import json
import re
import tarfile
import threading
import zipfile
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from yarl import URL

from bridge.smoke.loopback import LoopbackServer

# Fixed timestamps, so the same definition always gives the same bytes (and hashes).
_TAR_MTIME = 499162500  # npm's own fixed mtime for packed files (1985-10-26)
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def normalize(name: str) -> str:
    """A project name as PEP 503 normalises it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_dist(name: str) -> str:
    """The distribution part of a wheel's file name (binary distribution format spec)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.+-]", version))


@dataclass(frozen=True)
class NpmVersion:
    name: str
    version: str
    dependencies: dict[str, str]
    tarball: bytes
    integrity: str  # sha512-<base64>, as lockfiles and packuments carry it
    shasum: str  # sha1 hex

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}.tgz"


@dataclass(frozen=True)
class Wheel:
    project: str  # normalised
    version: str
    filename: str
    data: bytes
    sha256: str


def npm_tarball(name: str, version: str, files: dict[str, str], dependencies: dict[str, str]):
    """A package tarball as `npm pack` lays it out: gzip tar, everything under package/.
    A package.json is generated unless `files` has one."""
    files = dict(files)
    files.setdefault(
        "package.json",
        json.dumps(
            {"name": name, "version": version, "main": "index.js", "dependencies": dependencies},
            indent=2,
        )
        + "\n",
    )
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            data = files[path].encode()
            info = tarfile.TarInfo(f"package/{path}")
            info.size, info.mode, info.mtime = len(data), 0o644, _TAR_MTIME
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def build_wheel(name: str, version: str, modules: dict[str, str]) -> tuple[str, bytes]:
    """A pure-Python wheel (py3-none-any): the modules, METADATA, WHEEL and RECORD."""
    dist = _wheel_dist(name)
    info = f"{dist}-{version}.dist-info"
    files = dict(modules)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: worker-bridge-tests\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([path, f"sha256={digest}", len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, text in files.items():
            entry = zipfile.ZipInfo(path, date_time=_ZIP_DATE)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, text)
    return f"{dist}-{version}-py3-none-any.whl", out.getvalue()


class PackageServer(LoopbackServer):
    """An npm registry and a PEP 503 simple index on 127.0.0.1, from what `add_npm` and
    `add_wheel` define (safe from any thread, while serving too; `add_npm` needs the port, so
    call it after start() unless `base_url` is given). `requests` lists the path (with query) of
    every request received, in order, 404s included.

    `base_url` fixes the prefix of packuments' tarball URLs; by default they are built from the
    Host header the client sent (through a proxy too, that is the target's host)."""

    def __init__(self, *, base_url: str | None = None, port: int = 0) -> None:
        self.port = port
        self.base_url = base_url.rstrip("/") if base_url else None
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._requests: list[str] = []
        self._npm: dict[str, dict[str, NpmVersion]] = {}
        self._wheels: dict[str, dict[str, Wheel]] = {}  # project -> filename -> wheel

    def __enter__(self) -> PackageServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """http://localhost:<port>, no trailing slash (npm wants `npm_config_registry` with one)."""
        if not self.port:
            raise RuntimeError("PackageServer: start() it first, the port is picked then")
        return f"http://localhost:{self.port}"

    @property
    def requests(self) -> list[str]:
        """A copy of the paths requested so far."""
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # -- definitions --------------------------------------------------------------------------

    def add_npm(
        self,
        name: str,
        version: str,
        files: dict[str, str],
        dependencies: dict[str, str] | None = None,
    ) -> dict:
        """Publish name@version with `files` (paths relative to the package root). Returns what
        a lockfile entry needs: {"version", "resolved", "integrity"} (`resolved` uses `url`, so
        the server must be started, or `base_url` given)."""
        if "/" in name:
            raise ValueError("PackageServer: scoped npm names are not supported")
        deps = dict(dependencies or {})
        tarball = npm_tarball(name, version, files, deps)
        entry = NpmVersion(
            name=name,
            version=version,
            dependencies=deps,
            tarball=tarball,
            integrity="sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode(),
            shasum=hashlib.sha1(tarball).hexdigest(),
        )
        with self._lock:
            self._npm.setdefault(name, {})[version] = entry
        return {
            "version": version,
            "resolved": f"{self.base_url or self.url}/{name}/-/{entry.filename}",
            "integrity": entry.integrity,
        }

    def has_npm(self, name: str, version: str) -> bool:
        with self._lock:
            return version in self._npm.get(name, {})

    def add_wheel(self, name: str, version: str, modules: dict[str, str]) -> str:
        """Publish a pure-Python wheel of `modules` (path in the wheel -> source, e.g.
        {"wbdep/__init__.py": "VALUE = 42\\n"}). Returns the wheel's file name."""
        filename, data = build_wheel(name, version, modules)
        wheel = Wheel(normalize(name), version, filename, data, hashlib.sha256(data).hexdigest())
        with self._lock:
            self._wheels.setdefault(wheel.project, {})[filename] = wheel
        return filename

    def has_wheel(self, name: str, version: str) -> bool:
        with self._lock:
            return any(w.version == version for w in self._wheels.get(normalize(name), {}).values())

    # -- serving ------------------------------------------------------------------------------

    def routes(self, app: web.Application) -> None:
        app.middlewares.append(self._record)
        app.router.add_get("/simple/", self._simple_root)
        app.router.add_get("/simple/{project}/", self._simple_project)
        app.router.add_get("/simple/{project}", self._simple_redirect)
        app.router.add_get("/files/{filename}", self._wheel_file)
        app.router.add_get("/{name}/-/{filename}", self._npm_tarball)
        app.router.add_get("/{name}", self._packument)

    @web.middleware
    async def _record(self, request: web.Request, handler) -> web.StreamResponse:
        with self._lock:
            self._requests.append(request.rel_url.path_qs)
        return await handler(request)

    def _tarball_base(self, request: web.Request) -> str:
        return self.base_url or f"http://{request.host}"

    async def _packument(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        with self._lock:
            versions = dict(self._npm.get(name, {}))
        if not versions:
            return web.json_response({"error": "Not found"}, status=404)
        base = self._tarball_base(request)
        latest = max(versions, key=_version_key)
        doc = {
            "name": name,
            "dist-tags": {"latest": latest},
            "versions": {
                v.version: {
                    "name": name,
                    "version": v.version,
                    "dependencies": v.dependencies,
                    "dist": {
                        "tarball": f"{base}/{name}/-/{v.filename}",
                        "integrity": v.integrity,
                        "shasum": v.shasum,
                    },
                }
                for v in versions.values()
            },
        }
        return web.json_response(doc)

    async def _npm_tarball(self, request: web.Request) -> web.Response:
        name, filename = request.match_info["name"], request.match_info["filename"]
        with self._lock:
            found = [v for v in self._npm.get(name, {}).values() if v.filename == filename]
        if not found:
            return web.Response(status=404, text="no such tarball\n")
        return web.Response(body=found[0].tarball, content_type="application/octet-stream")

    async def _simple_root(self, request: web.Request) -> web.Response:
        with self._lock:
            projects = sorted(self._wheels)
        links = "".join(f'<a href="{p}/">{p}</a>\n' for p in projects)
        return self._html(links)

    async def _simple_redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently(f"/simple/{normalize(request.match_info['project'])}/")

    async def _simple_project(self, request: web.Request) -> web.Response:
        asked = request.match_info["project"]
        project = normalize(asked)
        if project != asked:
            raise web.HTTPMovedPermanently(f"/simple/{project}/")
        with self._lock:
            wheels = sorted(self._wheels.get(project, {}).values(), key=lambda w: w.filename)
        if not wheels:
            return web.Response(status=404, text="no such project\n")
        links = "".join(
            f'<a href="../../files/{html.escape(w.filename)}#sha256={w.sha256}">'
            f"{html.escape(w.filename)}</a><br/>\n"
            for w in wheels
        )
        return self._html(links, title=f"Links for {project}")

    async def _wheel_file(self, request: web.Request) -> web.Response:
        filename = request.match_info["filename"]
        with self._lock:
            found = [
                w for ws in self._wheels.values() for w in ws.values() if w.filename == filename
            ]
        if not found:
            return web.Response(status=404, text="no such file\n")
        return web.Response(body=found[0].data, content_type="application/octet-stream")

    @staticmethod
    def _html(body: str, title: str = "Simple index") -> web.Response:
        page = (
            f"<!DOCTYPE html>\n<html><head><meta name='pypi:repository-version' content='1.0'>"
            f"<title>{html.escape(title)}</title></head><body>\n{body}</body></html>\n"
        )
        return web.Response(text=page, content_type="text/html")


_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
}


class ForwardingProxy(LoopbackServer):
    """A plain HTTP forward proxy on 127.0.0.1 (a model of the gateway's HTTP path): it forwards
    absolute-URI requests (`GET http://host:port/path`) and refuses anything else, CONNECT
    included, with 405. `requests` lists the request targets it saw, in order."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._requests: list[str] = []
        self._session: aiohttp.ClientSession | None = None

    def __enter__(self) -> ForwardingProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._session is not None:
            asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(10)
        super().stop()

    @property
    def requests(self) -> list[str]:
        with self._lock:
            return list(self._requests)

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._forward)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        target = request.raw_path  # the request target as sent: absolute-form for a proxy
        with self._lock:
            self._requests.append(f"{request.method} {target}")
        if request.method == "CONNECT" or not target.startswith("http://"):
            return web.Response(status=405, text="absolute http:// URIs only\n")
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read()
        try:
            async with self._session.request(
                request.method,
                URL(target, encoded=True),
                headers=headers,
                data=body or None,
                allow_redirects=False,
            ) as upstream:
                data = await upstream.read()
                status, upstream_headers = upstream.status, upstream.headers
        except aiohttp.ClientError as exc:
            return web.Response(status=502, text=f"upstream: {exc}\n")
        out = {k: v for k, v in upstream_headers.items() if k.lower() not in _HOP_BY_HOP}
        return web.Response(status=status, headers=out, body=data)
