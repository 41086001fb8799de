"""The daemon's import graph has no circle.

What counts as an edge: an ``import`` or ``from ... import`` executed when a module of
``openwop_memory`` is imported, that is, at module level (inside ``if``/``try`` blocks too),
but not inside a function or class body (a deferred import runs later, by design, and
cannot make a half-initialised module visible), and not under ``if TYPE_CHECKING:`` (never
executed). Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, so it is an
edge to those packages as well, except to the importing module's own enclosing packages
(Python has begun importing them before any of their modules runs: a package's
``__init__`` importing its own submodules is not a circle). ``from pkg import name`` is
an edge to ``pkg.name`` when that is a module.

Known circles are listed with their reason; the test fails on any other circle, and on a
listed one that no longer exists (so the list cannot go stale).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parents[2] / "sidecar" / "src"
PACKAGE = "openwop_memory"

# Each: the modules of one strongly connected component, and why it is still allowed.
KNOWN_CIRCLES: dict[frozenset[str], str] = {}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in (ROOT / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _executed_imports(
    body: list[ast.stmt], *, deferred: bool = False
) -> list[ast.Import | ast.ImportFrom]:
    """The import statements run at import time: module level, into if/try/with blocks,
    never into function or class bodies (unless ``deferred``) or ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif deferred and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found += _executed_imports(node.body, deferred=True)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += _executed_imports(node.body, deferred=deferred)
            found += _executed_imports(node.orelse, deferred=deferred)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                found += _executed_imports(block, deferred=deferred)
            for handler in node.handlers:
                found += _executed_imports(handler.body, deferred=deferred)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            found += _executed_imports(node.body, deferred=deferred)
    return found


def _with_parents(name: str, modules: dict[str, Path]) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()


def import_graph(*, deferred: bool = False) -> dict[str, set[str]]:
    """Each module of the package → the package's modules importing it runs (``deferred``:
    or that its functions import when they run)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        edges: set[str] = set()
        for node in _executed_imports(ast.parse(path.read_text()).body, deferred=deferred):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    edges |= _with_parents(alias.name, modules)
                continue
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            edges |= _with_parents(target, modules)
            for alias in node.names:
                edges |= {f"{target}.{alias.name}"} & modules.keys()
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = edges - ancestors - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_circle_but_the_known_ones() -> None:
    found = set(circles(import_graph()))
    assert sorted(map(sorted, found - KNOWN_CIRCLES.keys())) == []
    assert sorted(map(sorted, KNOWN_CIRCLES.keys() - found)) == []  # fixed: drop it here


# With the imports functions make when they run: the modules that still lean on each other.
KNOWN_DEFERRED_CIRCLES: dict[frozenset[str], str] = {}


def test_deferred_imports_make_no_circle_but_the_known_ones() -> None:
    """The CLI's commands import their modules when run (the probe's path stays light):
    that must not hide a circle either (cli <-> cli_admin was one)."""
    found = set(circles(import_graph(deferred=True)))
    assert sorted(map(sorted, found - KNOWN_DEFERRED_CIRCLES.keys())) == []
    assert sorted(map(sorted, KNOWN_DEFERRED_CIRCLES.keys() - found)) == []


def test_the_graph_sees_a_circle_made_of_module_level_imports() -> None:
    """The checker itself: a planted circle is found, a deferred or TYPE_CHECKING one is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [frozenset({"a", "b", "c"})]
    tree = ast.parse(
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import ghost\n"
        "def f():\n    import later\n"
        "try:\n    import fast\nexcept ImportError:\n    import slow\n"
    )
    names = [a.name for n in _executed_imports(tree.body) for a in getattr(n, "names", [])]
    assert names == ["os", "TYPE_CHECKING", "fast", "slow"]


# The package's parts from the bottom up; a module may import its own part or one below.
# retrieval/ sits below storage while the backends still call its fusion (issue 22 moves
# the search above them).
LAYERS: list[set[str]] = [
    {"timefmt", "domain", "token_count", "setting_types", "errors", "logs", "gcpolicy"},
    {"systemd", "backup_check", "redaction"},
    {"storage"},
    {"retrieval"},
    {"service"},
    {"wire", "config"},
    {"app"},
    {"server", "mcp_server"},
    {"cli", "__main__"},
]


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The edges from a module to one of a higher layer (the package's ``__init__`` and
    parts not in ``LAYERS`` are reported as unknown by the test below)."""
    rank = {part: i for i, layer in enumerate(LAYERS) for part in layer}
    return sorted(
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if _part(a) in rank and _part(b) in rank and rank[_part(b)] > rank[_part(a)]
    )


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {_part(m) for m in _modules()} - {"__init__"}
    assert sorted(parts - set().union(*LAYERS)) == []
    assert sorted(set().union(*LAYERS) - parts) == []  # a part was removed: drop it here


@pytest.mark.parametrize("deferred", [False, True])
def test_no_module_imports_a_layer_above_its_own(deferred: bool) -> None:
    """Storage never imports config (a backend's settings are its own model) and nothing
    imports the layers that use it, not even from inside a function."""
    assert upward_arrows(import_graph(deferred=deferred)) == []


def test_an_upward_arrow_is_seen() -> None:
    graph = {"openwop_memory.storage.x": {"openwop_memory.config"}, "openwop_memory.app": set()}
    assert upward_arrows(graph) == [("openwop_memory.storage.x", "openwop_memory.config")]
