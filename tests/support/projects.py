"""Throwaway committed git repositories whose setup needs a package index: a node project (one
npm dependency, pinned in a lockfile v3) and a Python project (one wheel in requirements.txt),
both resolved from a `PackageServer` (tests/support/registries.py), never a public registry.

What a run of each needs (no .npmrc or pip.conf is committed):
- `npm ci`: nothing, the lockfile's `resolved` URLs name the server. `npm install` (or anything
  that resolves a version) also needs `npm_config_registry=<server.url>/`.
- pip: `--index-url <server.url>/simple` (or `PIP_INDEX_URL`), and `--trusted-host localhost`
  is harmless (the index is plain http).
Both go through a proxy when `HTTP_PROXY` is set and `localhost` is not in `NO_PROXY` (see
tests/environments/test_registries.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from support.registries import PackageServer
from support.repos import git, make_repo

NODE_DEP = "wb-left-pad"
NODE_NAME = "wb-node-demo"
FILLER_PREFIX = "wb-dep-"
PY_DEP = "wbdep"
PY_DEP_VERSION = "1.0"


def left_pad_files(version: str) -> dict[str, str]:
    """The published files of wb-left-pad@version (it reports its version as `VERSION`)."""
    return {
        "index.js": (
            '"use strict";\n'
            "module.exports = function leftPad(value, width, fill) {\n"
            "  const s = String(value);\n"
            '  const c = fill === undefined ? " " : String(fill);\n'
            "  return s.length >= width ? s : c.repeat(width - s.length) + s;\n"
            "};\n"
            f"module.exports.VERSION = {json.dumps(version)};\n"
        ),
        "README.md": f"# {NODE_DEP} {version}\n",
    }


def publish_left_pad(server: PackageServer, version: str) -> dict:
    """Publish wb-left-pad@version; returns its lockfile entry fields. Publishing is
    deterministic (same bytes, same integrity), so publishing a version again changes nothing."""
    return server.add_npm(NODE_DEP, version, left_pad_files(version))


def _dump(doc: dict) -> str:
    return json.dumps(doc, indent=2) + "\n"


def node_manifests(entries: dict[str, dict]) -> dict[str, str]:
    """package.json and package-lock.json (v3) of a project depending on each package of
    ``entries`` (name -> the lockfile entry `PackageServer.add_npm` returned), pinned exactly."""
    deps = {name: entry["version"] for name, entry in entries.items()}
    package = {
        "name": NODE_NAME,
        "version": "1.0.0",
        "private": True,
        "scripts": {"test": "node test.js"},
        "dependencies": deps,
    }
    packages: dict[str, dict] = {"": {"name": NODE_NAME, "version": "1.0.0", "dependencies": deps}}
    for name, entry in entries.items():
        packages[f"node_modules/{name}"] = {
            "version": entry["version"],
            "resolved": entry["resolved"],
            "integrity": entry["integrity"],
        }
    lock = {
        "name": NODE_NAME,
        "version": "1.0.0",
        "lockfileVersion": 3,
        "requires": True,
        "packages": packages,
    }
    return {"package.json": _dump(package), "package-lock.json": _dump(lock)}


def node_files(server: PackageServer, dep_version: str) -> dict[str, str]:
    """package.json and package-lock.json for wb-left-pad@dep_version (publishing it)."""
    return node_manifests({NODE_DEP: publish_left_pad(server, dep_version)})


def filler_files(name: str, version: str, files: int) -> dict[str, str]:
    """The published files of a filler package: index.js requiring lib/part-*.js (``files`` in
    all with README.md, the generated package.json aside), each about a kilobyte."""
    parts = max(files - 2, 0)
    body = "".join(f"// {name} {version} line {i:02d}: {'x' * 40}\n" for i in range(16))
    out = {
        f"lib/part-{i}.js": f'"use strict";\n{body}module.exports = {i};\n' for i in range(parts)
    }
    out["index.js"] = (
        '"use strict";\n'
        + "".join(f'require("./lib/part-{i}.js");\n' for i in range(parts))
        + f"module.exports = {json.dumps(name)};\n"
    )
    out["README.md"] = f"# {name} {version}\n"
    return out


def publish_fillers(
    server: PackageServer, count: int, *, files_per_package: int = 8, version: str = "1.0.0"
) -> dict[str, dict]:
    """Publish ``count`` filler packages wb-dep-0000, wb-dep-0001... (no dependencies of their
    own); returns name -> lockfile entry, as `node_manifests` takes them."""
    return {
        name: server.add_npm(name, version, filler_files(name, version, files_per_package))
        for name in (f"{FILLER_PREFIX}{i:04d}" for i in range(count))
    }


def _commit(path: Path, files: dict[str, str], message: str) -> Path:
    if not path.exists():
        make_repo(path.parent, path.name)
    elif not (path / ".git").exists():
        git(path, "init", "-q", "-b", "main")
    for rel, text in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "--", *files)
    git(path, "commit", "-qm", message)
    return path


def node_project(path: Path, server: PackageServer, *, dep_version: str = "1.0.0") -> Path:
    """A committed node repository at `path` (created with a README if missing): depends on
    wb-left-pad@dep_version (published on `server` if not yet), pinned in package-lock.json;
    `npm test` runs test.js, which exits 1 unless the dependency works. node_modules/ ignored."""
    files = {**node_files(server, dep_version), **_node_sources()}
    return _commit(path, files, "node project")


def node_project_with_packages(
    path: Path, server: PackageServer, packages: int, *, files_per_package: int = 8
) -> Path:
    """`node_project` grown to ``packages`` npm packages in all: wb-left-pad@1.0.0 and
    ``packages - 1`` fillers (`publish_fillers`, ``files_per_package`` files each), all in
    package.json and package-lock.json; `npm test` still checks wb-left-pad. (For a size
    benchmark: `bump_dependency` rewrites the lockfile with wb-left-pad alone.)"""
    if packages < 1:
        raise ValueError("node_project_with_packages: at least one package (wb-left-pad)")
    entries = {NODE_DEP: publish_left_pad(server, "1.0.0")}
    entries.update(publish_fillers(server, packages - 1, files_per_package=files_per_package))
    files = {**node_manifests(entries), **_node_sources()}
    return _commit(path, files, f"node project, {packages} packages")


def _node_sources() -> dict[str, str]:
    """index.js, test.js and .gitignore of the node project."""
    files: dict[str, str] = {}
    files["index.js"] = (
        '"use strict";\n'
        f'const leftPad = require("{NODE_DEP}");\n\n'
        "function pad(n, width) {\n"
        '  return leftPad(n, width, "0");\n'
        "}\n\n"
        "module.exports = { pad, depVersion: leftPad.VERSION };\n"
    )
    files["test.js"] = (
        '"use strict";\n'
        'const { pad, depVersion } = require("./index");\n\n'
        "const got = pad(5, 3);\n"
        'if (got !== "005") {\n'
        '  console.error(`pad(5, 3) gave ${JSON.stringify(got)}, wanted "005"`);\n'
        "  process.exit(1);\n"
        "}\n"
        f"console.log(`ok: {NODE_DEP} ${{depVersion}}`);\n"
    )
    files[".gitignore"] = "node_modules/\n"
    return files


def bump_dependency(
    repo: Path, server: PackageServer, version: str, *, write: bool = False
) -> dict[str, str]:
    """Publish wb-left-pad@version and return the new package.json and package-lock.json
    ({path: text}, e.g. for a mock worker's `write`). The repository is left as it is unless
    `write`, which writes and commits them."""
    files = node_files(server, version)
    # Keep whatever else the project's package.json has (scripts, name); only the pin moves.
    package = json.loads((repo / "package.json").read_text())
    package.setdefault("dependencies", {})[NODE_DEP] = version
    files["package.json"] = _dump(package)
    if write:
        _commit(repo, files, f"{NODE_DEP} {version}")
    return files


def python_project(path: Path, server: PackageServer) -> Path:
    """A committed Python repository at `path` (created with a README if missing):
    requirements.txt pins wbdep==1.0 (a wheel published on `server` if not yet), calc.py uses
    it, tests/test_calc.py (pytest) checks it. .venv/ and __pycache__/ ignored."""
    if not server.has_wheel(PY_DEP, PY_DEP_VERSION):
        server.add_wheel(
            PY_DEP,
            PY_DEP_VERSION,
            {f"{PY_DEP}/__init__.py": "VALUE = 42\n\n\ndef double(x):\n    return 2 * x\n"},
        )
    files = {
        "requirements.txt": f"{PY_DEP}=={PY_DEP_VERSION}\n",
        "calc.py": (
            f"import {PY_DEP}\n\n\ndef answer():\n    return {PY_DEP}.double({PY_DEP}.VALUE) // 2\n"
        ),
        "tests/test_calc.py": (
            "from calc import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"
        ),
        ".gitignore": ".venv/\n__pycache__/\n",
    }
    return _commit(path, files, "python project")
