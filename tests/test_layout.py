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
    "mcp": ("mcp_server.py", "mcp_tools.py", "mcp_http.py"),
    "yaml": "config.py",
    "pydantic_settings": "config.py",
    "tenacity": "sandbox/",
    # the gateway, and the scripted model server that smoke tests and the tests serve
    "aiohttp": ("gateway/", "smoke/"),
    # h11 also for the MCP listener's protocol (its deadlines read the parser's state)
    "h11": ("gateway/", "mcp_http_limits.py"),
    "uvicorn": ("mcp_http.py", "mcp_http_limits.py"),
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


def _bridge_imports(path: Path) -> set[str]:
    """bridge.* modules ``path`` imports, anywhere in it except `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(child) for child in ast.walk(node))
    names = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("bridge"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("bridge"):
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _module_graph() -> dict[str, set[str]]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        modules[name] = path
    return {
        name: {m for m in _bridge_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def test_no_module_imports_a_module_that_imports_it_back():
    graph = _module_graph()
    # Packages re-export their modules; a package importing its own modules is not a cycle.
    edges = {a: {b for b in bs if not a == b.rpartition(".")[0]} for a, bs in graph.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(edges.get(node, ()))
        return False

    cycles = sorted(
        f"{a} <-> {b}" for a, bs in edges.items() for b in bs if a < b and reaches(b, a)
    )
    assert cycles == []


def test_no_phase_imports_the_runner():
    graph = _module_graph()
    for phase in ("prepare", "worker_turn", "collect", "verify", "finish", "containers"):
        assert "bridge.pipeline.runner" not in graph[f"bridge.pipeline.{phase}"], phase
