"""validators imports only what DESIGN.md allows: opgraph.ir and hardware (plus the saved catalog
format in the sweep modules, which are sweeps over catalogs)."""

from __future__ import annotations

import ast
from pathlib import Path

import validators

ROOT = Path(validators.__file__).parent
CATALOG_READERS = {"sweep/loader.py", "sweep/generate.py", "coverage/report.py"}
"""Modules that read saved catalogs (coverage/report.py only for operation_name, which now lives in
opgraph.ir.configs: it leaves this set once that import moves)."""


def _opgraph_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n == "opgraph" or n.startswith("opgraph.")}


def test_validators_import_only_the_ir_and_hardware() -> None:
    bad: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        allowed = ("opgraph.ir", "opgraph.catalog") if rel in CATALOG_READERS else ("opgraph.ir",)
        wrong = {m for m in _opgraph_imports(path) if not any(m == a or m.startswith(a + ".") for a in allowed)}
        if wrong:
            bad[rel] = wrong
    assert not bad
