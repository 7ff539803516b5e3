"""Architecture guards: each third-party package is imported in one place, and the public API."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import bridge

PACKAGE = Path(bridge.__file__).parent

# third-party module -> the only package path allowed to import it
OWNERS = {
    "docker": "sandbox/",
    "requests": "sandbox/",
    "sqlite_utils": "store/",
    "sqlite3": "store/",
    "mcp": "mcp/",
    "yaml": "config/settings.py",
    "pydantic_settings": "config/settings.py",
    "tenacity": "sandbox/",
    # the gateway, and the scripted model server that smoke tests and the tests serve
    "aiohttp": ("gateway/", "smoke/"),
    # h11 also for the HTTP listener's deadlines (they read the parser's state)
    "h11": ("gateway/", "listener/limits.py"),
    "uvicorn": "listener/",
    "ray": "pipeline/nodes.py",  # the `cluster` extra, imported when a cluster is configured
    "starlette": "ui/",  # the web view (its listener is the MCP one's stack)
    "anyio": "mcp/",  # the MCP tools' threads and waits
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


def _third_party_imports() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        found |= _imports(path)
    return {m for m in found if m not in sys.stdlib_module_names and m != "bridge"}


def test_every_third_party_package_imported_is_a_declared_dependency():
    """What bridge/ imports is named in pyproject.toml's dependencies (or an extra's, as Ray
    for the cluster), not left to arrive with another package (a dependency that drops it
    would break the install)."""
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    extras = [spec for specs in project.get("optional-dependencies", {}).values() for spec in specs]
    declared = {
        re.split(r"[\s<>=~!\[;]", spec, maxsplit=1)[0].lower().replace("_", "-")
        for spec in [*project["dependencies"], *extras]
    }
    providers = importlib.metadata.packages_distributions()
    undeclared = sorted(
        module
        for module in _third_party_imports()
        if not {d.lower().replace("_", "-") for d in providers.get(module, [module])} & declared
    )
    assert undeclared == []


def test_the_public_api_is_what_all_says():
    assert "WorkerBridge" in bridge.__all__
    for name in bridge.__all__:
        assert hasattr(bridge, name), name


def test_every_module_opens_with_a_docstring():
    for path in PACKAGE.rglob("*.py"):
        assert ast.get_docstring(ast.parse(path.read_text())), path


# Size guards catch what hurts a reader (a module that does too much, a function to scroll
# through); they are not targets to split by. The few functions past the limit, each with why.
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60  # statements, after the signature and the docstring
LONG_FUNCTIONS = {
    # one step after another on one container, each needing the one before it
    "bridge/environments/run.py:run_setup": "a setup run's steps in the order they happen",
    "bridge/environments/run.py:_commands": "each setup command's container, its exit judged",
    "bridge/gateway/upstream.py:stream": "one upstream exchange: connect, send, relay, account",
    "bridge/pipeline/worker_turn.py:run_worker_turn": "one worker container from spec to exit",
}


def _statement_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return node.end_lineno - body[0].lineno + 1 if body and node.end_lineno else 0


def test_no_module_or_function_grows_past_what_a_reader_can_hold():
    too_long = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = _statement_lines(node)
                if lines > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in LONG_FUNCTIONS:
                    too_long.append(f"{rel}:{node.name}: {lines} lines")
    assert too_long == []


def test_every_listed_long_function_still_exists_and_is_still_long():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found[f"{rel}:{node.name}"] = _statement_lines(node)
    stale = [name for name in LONG_FUNCTIONS if found.get(name, 0) <= MAX_FUNCTION_LINES]
    assert stale == [], "shortened or gone: take it off LONG_FUNCTIONS"


def _bridge_imports(path: Path) -> set[str]:
    """bridge.* modules ``path`` imports anywhere: at the top, inside functions, and under
    `if TYPE_CHECKING:` (a type-only import is a dependency all the same)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("bridge"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("bridge"):
                if node.module != "bridge":  # `from bridge import x` may import a module
                    names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _module_graph() -> dict[str, set[str]]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        modules[name] = path
    graph = {
        name: {m for m in _bridge_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    # Packages re-export their modules; a package importing its own modules is not a cycle.
    return {a: {b for b in bs if a != b.rpartition(".")[0]} for a, bs in graph.items()}


def _cycles(edges: dict[str, set[str]]) -> list[str]:
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

    return sorted(
        {" <-> ".join(sorted((a, b))) for a, bs in edges.items() for b in bs if reaches(b, a)}
    )


def _package(module: str) -> str:
    """bridge.<first part>: a sub-package, or a top-level module."""
    return ".".join(module.split(".")[:2])


def _package_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for a, bs in _module_graph().items():
        for b in bs:
            if _package(a) != _package(b):
                edges.setdefault(_package(a), set()).add(_package(b))
    return edges


def test_no_module_imports_a_module_that_imports_it_back():
    assert _cycles(_module_graph()) == []


def test_no_package_imports_a_package_that_imports_it_back():
    assert _cycles(_package_graph()) == []


# Layers, lowest first: a package may import its own layer and those below, never one above.
LAYERS = [
    {"bridge.version", "bridge.errors", "bridge.models", "bridge.host"},
    {"bridge.config"},  # settings, sections, the variables' names, profiles
    {"bridge.redact", "bridge.records", "bridge.documents", "bridge.events", "bridge.display"},
    {
        "bridge.store",
        "bridge.sandbox",
        "bridge.workspace",
        "bridge.scope",
        "bridge.gateway",
        "bridge.asking",  # a worker's block and prompt text: read by workers and the store
    },
    # The workers (and their circuit breaker); a phase's kit; the cluster's pieces (issue 44:
    # images by id, bundles, the relay, what crosses to a node; its agent, which runs phases,
    # is the pipeline's: bridge/pipeline/node_agent.py).
    {"bridge.workers", "bridge.phase", "bridge.cluster"},
    {"bridge.environments"},
    {"bridge.pipeline"},  # task creation, the runner and its phases
    {"bridge.jobs"},  # several tasks advanced together, through the pipeline
    {"bridge.service"},  # the facade, its job verbs, doctor
    {"bridge.smoke"},  # runs tasks through the facade
    {"bridge.listener"},  # the HTTP listener the MCP server and the web view share
    {"bridge.cli", "bridge.mcp", "bridge.ui"},
    {"bridge"},  # the public API: WorkerBridge and the records
]


def test_packages_import_only_their_own_layer_and_those_below():
    layer = {package: n for n, packages in enumerate(LAYERS) for package in packages}
    graph = _package_graph()
    unplaced = sorted({p for p in graph} - set(layer))
    assert unplaced == [], "every package has a layer"
    upward = sorted(
        f"{a} -> {b}" for a, bs in graph.items() for b in bs if layer.get(b, -1) > layer[a]
    )
    assert upward == []


def test_the_pipeline_reaches_the_environments_through_their_one_door():
    for module, imported in _module_graph().items():
        if module.startswith("bridge.pipeline"):
            into = {m for m in imported if m.startswith("bridge.environments")}
            assert into <= {"bridge.environments.task"}, (module, into)


def test_the_front_ends_call_only_the_facade():
    allowed = (
        "bridge.service",
        "bridge.records",
        "bridge.documents",
        "bridge.errors",
        "bridge.models",
        "bridge.config",
        "bridge.version",
        "bridge.smoke",
        "bridge.display",
        "bridge.host.heap",
        "bridge.listener",
        "bridge.cli",
        "bridge.mcp",
        "bridge.ui",
    )
    for module, imported in _module_graph().items():
        if module.startswith(("bridge.cli", "bridge.mcp", "bridge.ui")):
            beyond = sorted(m for m in imported if not m.startswith(allowed))
            assert beyond == [], (module, beyond)


def test_no_phase_imports_the_runner():
    graph = _module_graph()
    for phase in ("prepare", "worker_turn", "collect", "verify", "finish"):
        assert "bridge.pipeline.runner" not in graph[f"bridge.pipeline.{phase}"], phase
    for module in graph:
        if module.startswith("bridge.phase"):
            assert "bridge.pipeline.runner" not in graph[module], module


def test_the_cycle_check_finds_a_cycle_whichever_way_its_names_sort():
    assert _cycles({"a": {"b"}, "b": {"a"}}) == ["a <-> b"]
    assert _cycles({"z": {"a"}, "a": {"m"}, "m": {"z"}}) != []
    assert _cycles({"a": {"b"}, "b": {"c"}}) == []
