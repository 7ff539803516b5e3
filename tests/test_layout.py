"""Architecture guards: each third-party package is imported in one place, and the public API."""

from __future__ import annotations

import ast
from pathlib import Path

import bridge

PACKAGE = Path(bridge.__file__).parent

# third-party module -> the only package path allowed to import it
OWNERS = {
    "docker": "sandbox/",
    "requests": "sandbox/",
    "sqlite_utils": "store/",
    "sqlite3": "store/",
    "mcp": "mcp_server.py",
    "yaml": "config.py",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_each_third_party_package_is_imported_only_by_its_owner():
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        for module in _imports(path) & set(OWNERS):
            assert rel.startswith(OWNERS[module]), f"{rel} imports {module}"


def test_the_public_api_is_what_all_says():
    assert "WorkerBridge" in bridge.__all__
    for name in bridge.__all__:
        assert hasattr(bridge, name), name


def test_every_module_opens_with_a_docstring():
    for path in PACKAGE.rglob("*.py"):
        assert ast.get_docstring(ast.parse(path.read_text())), path


def test_modules_stay_under_about_400_lines():
    for path in PACKAGE.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 420, path
