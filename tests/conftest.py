"""Shared fixtures: paths to the real traces, golden-file comparison."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import Result
from typer.testing import CliRunner

from benchmarks._common import TINY_LLAMA

REPO = Path(__file__).resolve().parents[1]
TRACES = (REPO / ".." / "shared" / "data" / "traces").resolve()
GOLDEN = REPO / "tests" / "golden"


@pytest.fixture
def traces_dir() -> Path:
    """The shared real traces; skips the test when the folder is absent."""
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES} (they live in ../shared/data/traces beside the repo)")
    return TRACES


def check_golden(relpath: str, actual: str | dict[str, object] | list[object]) -> None:
    """Compare ``actual`` with ``tests/golden/<relpath>``; ``OPGRAPH_UPDATE_GOLDEN=1`` rewrites it.

    A missing golden file fails everywhere (a developer machine as well as CI): a golden is written
    only when the user asks for it with ``OPGRAPH_UPDATE_GOLDEN=1``, never as a side effect of a run.
    """
    text = actual if isinstance(actual, str) else json.dumps(actual, indent=2, sort_keys=True) + "\n"
    path = GOLDEN / relpath
    if os.environ.get("OPGRAPH_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"golden file {path} is missing; run with OPGRAPH_UPDATE_GOLDEN=1 to write it, then commit it")
    expected = path.read_text()
    assert text == expected, f"output differs from golden {path}; rerun with OPGRAPH_UPDATE_GOLDEN=1 if intended"


def cli_runner() -> CliRunner:
    """A Typer test runner that keeps stderr apart from stdout, on any click version."""
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:  # click >= 8.2 keeps stderr apart already
        return CliRunner()


def one_error_line(res: Result) -> str:
    """The one ``error: ...`` line a bad CLI call writes on stderr (exit code 2, no traceback)."""
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, (res.exit_code, res.stderr)
    assert lines[0].startswith("error: ") and "Traceback" not in res.stderr
    return lines[0]


@pytest.fixture
def golden() -> object:
    """The :func:`check_golden` function, as a fixture: ``golden("area/name.json", data)``."""
    return check_golden


@pytest.fixture
def tiny_config(tmp_path: Path) -> str:
    """Path of a ``config.json`` holding :data:`TINY_LLAMA`."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


@pytest.fixture(scope="session")
def graphs() -> ModuleType:
    """Builders of hand-written llama-like graphs (``graphs.llama_like(...)``), shared by the catalog,
    coverage and sweep tests."""
    import tests.opgraph.catalog.handmade_graphs as module

    return module
