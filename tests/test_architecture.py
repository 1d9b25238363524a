"""The module import graph: no cycles, and the package boundaries of DESIGN.md.

The graph is built from the source (``ast``), not by importing anything, so it sees every module
whether or not a test imports it. Every import counts, at module level or inside a function
(lazy imports keep heavy dependencies out of ``import opgraph``; they must not hide a cycle), except
those under ``if TYPE_CHECKING:``, which never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

from tests.conftest import REPO

PACKAGES = ("opgraph", "hardware", "simulators", "validators")

ALLOWED: dict[str, tuple[str, ...]] = {
    # DESIGN.md's table: what each package may import (besides itself and third-party libraries).
    "hardware": ("opgraph.ir",),
    "simulators": ("opgraph.ir", "hardware"),
    "validators": ("opgraph.ir", "hardware"),
}

EXCEPTIONS: dict[str, tuple[str, ...]] = {
    # Sweeps are defined over catalogs (DESIGN.md: "sweeps over traced configs across models"): the
    # modules that read a saved Catalog may import its model. Config identity (hashes, operation
    # names) lives in opgraph.ir.configs, so nothing else in validators needs opgraph.catalog.
    "validators.sweep.loader": ("opgraph.catalog",),
    "validators.sweep.generate": ("opgraph.catalog",),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_nodes(body: list[ast.stmt]) -> list[ast.stmt]:
    """Every statement that can run (descending into blocks and function bodies), less TYPE_CHECKING blocks."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                out += _import_time_nodes(node.body)
            out += _import_time_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                out += _import_time_nodes(block)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            out += _import_time_nodes(node.body)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # Imports inside functions run later, but they still tie the modules together: a lazy
            # import is for keeping heavy dependencies out of start-up, not for hiding a cycle.
            out += _import_time_nodes(node.body)
        else:
            out.append(node)
    return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    drop = node.level - 1 if is_package else node.level
    base = base[: len(base) - drop] if drop else base
    return ".".join([*base, *([node.module] if node.module else [])])


def import_graph() -> nx.DiGraph:
    """Directed graph: module -> project module it imports at import time."""
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)

    def target(name: str) -> str | None:
        # The longest prefix of ``name`` that is one of the project's modules.
        parts = name.split(".")
        while parts:
            candidate = ".".join(parts)
            if candidate in modules:
                return candidate
            parts.pop()
        return None

    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _import_time_nodes(tree.body):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path.name == "__init__.py", node)
                # ``from pkg import sub`` imports the submodule ``pkg.sub`` when there is one.
                names = [f"{base}.{alias.name}" for alias in node.names] or [base]
            for name in names:
                dst = target(name)
                if dst is not None and dst != module:
                    graph.add_edge(module, dst)
    return graph


def _package_of(module: str) -> str:
    return module.split(".")[0]


def _cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Cycles between modules, ignoring a package's ``__init__`` re-exporting its own submodules.

    A facade (``pkg/__init__.py``) imports its submodules, and a submodule importing a sibling through
    ``from pkg.sibling import x`` reaches ``pkg`` first: that edge into the facade is Python's package
    mechanics, not a design cycle, so edges from a module into one of its own parent packages are left out.
    """
    pruned = nx.DiGraph()
    pruned.add_nodes_from(graph)
    for src, dst in graph.edges:
        if src.startswith(dst + "."):
            continue
        pruned.add_edge(src, dst)
    return [sorted(c) for c in nx.strongly_connected_components(pruned) if len(c) > 1]


def test_the_graph_sees_known_imports() -> None:
    graph = import_graph()
    # A sanity check that the builder resolves absolute and relative imports.
    assert graph.has_edge("simulators.api", "opgraph.ir") or any(
        dst.startswith("opgraph.ir") for dst in graph.successors("simulators.api")
    )
    assert graph.number_of_edges() > 100


def test_no_import_cycles_among_project_modules() -> None:
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_boundaries_of_the_design(package: str) -> None:
    graph = import_graph()
    bad = sorted(
        (src, dst)
        for src, dst in graph.edges
        if _package_of(src) == package
        and _package_of(dst) in PACKAGES
        and not any(dst == a or dst.startswith(a + ".") for a in (package, *ALLOWED[package], *EXCEPTIONS.get(src, ())))
    )
    assert not bad, f"{package} imports outside DESIGN.md's table: {bad}"


def test_nothing_imports_the_cli() -> None:
    graph = import_graph()
    # ``python -m opgraph`` (opgraph/__main__.py) is the CLI's other entry point.
    entry = ("opgraph.cli", "opgraph.__main__")
    bad = sorted((s, d) for s, d in graph.edges if d.startswith("opgraph.cli") and not s.startswith(entry))
    assert not bad, bad


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = nx.DiGraph([("a.x", "a.y"), ("a.y", "a.x"), ("a.z", "a")])
    assert _cycles(graph) == [["a.x", "a.y"]]
