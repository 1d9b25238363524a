"""Shared fixtures: paths to the real traces, golden-file comparison."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import Result
from typer.testing import CliRunner

# The packages, imported here once: under xdist the controller imports a worker's warning category
# (hardware's HardwareIgnoredWarning, ...) from one receiving thread per worker, and two threads
# importing these mutually importing packages at once deadlock (seen with 14 workers on a 16-core host).
import hardware  # noqa: F401
import opgraph  # noqa: F401
import simulators  # noqa: F401
import validators  # noqa: F401
from benchmarks._common import TINY_LLAMA

REPO = Path(__file__).resolve().parents[1]
TRACES = (REPO / ".." / "shared" / "data" / "traces").resolve()
GOLDEN = REPO / "tests" / "golden"

CAPTURED_WITH = "5.24"
"""The transformers release (major.minor) that goldens and committed predictions resting on a capture of a
real preset were made with. A capture records the model's own code, which changes between releases
(5.17 computes RoPE's angles with a ``bmm``, grows an all-ones attention mask every generate step and
masks MoE sentinel rows on every call; 5.18 on do none of these), so such numbers hold for that release
only: under another, the tests that compare them skip and say why (:func:`skip_unless_captured_with`)."""


def transformers_release(version: str | None = None) -> str:
    """``major.minor`` of ``version`` (default: the installed transformers).

    >>> transformers_release("5.24.0")
    '5.24'
    """
    if version is None:
        import transformers

        version = str(transformers.__version__)
    return ".".join(version.split(".")[:2])


def skip_unless_captured_with(version: str, what: str) -> None:
    """Skip the calling test when the installed transformers is another release than ``version``, the one
    ``what`` was captured with: its model code differs, so the comparison would be of another program."""
    installed = transformers_release()
    if installed != transformers_release(version):
        pytest.skip(
            f"{what}: made from captures with transformers {transformers_release(version)}, "
            f"and {installed} is installed, whose model code differs"
        )


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

    Text (a ``str``) must match exactly. A dict or list is compared as JSON, structurally: keys, list
    lengths, strings, ints, bools and nulls exactly, floats within ``rel_tol=1e-9, abs_tol=1e-12``
    (float sums differ in their last digit between CPUs and numpy builds). A mismatch names the first
    differing JSON path (``points[2].speedup``) with both values.
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
    hint = "rerun with OPGRAPH_UPDATE_GOLDEN=1 if intended"
    if isinstance(actual, str):
        assert text == expected, f"output differs from golden {path}; {hint}"
        return
    try:
        golden_value = json.loads(expected)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"output differs from golden {path}: the golden is not JSON ({exc}); {hint}") from None
    # Through JSON and back, so tuples, int keys and the like compare as the written golden holds them.
    difference = _json_difference(golden_value, json.loads(text), "")
    assert difference is None, f"output differs from golden {path} at {difference}; {hint}"


def _json_path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{json.dumps(key)}]"


def _json_difference(expected: object, actual: object, where: str) -> str | None:
    """``'<path>: golden X, actual Y'`` for the first place ``actual`` differs from ``expected``; else None."""
    at = where or "(top level)"
    if isinstance(expected, dict) and isinstance(actual, dict):
        missing = sorted(set(expected) - set(actual))
        extra = sorted(set(actual) - set(expected))
        if missing or extra:
            return f"{at}: keys differ (missing {missing}, unexpected {extra})"
        for key in sorted(expected):
            found = _json_difference(expected[key], actual[key], _json_path(where, key))
            if found is not None:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{at}: golden has {len(expected)} items, actual has {len(actual)}"
        for index, (e, a) in enumerate(zip(expected, actual, strict=True)):
            found = _json_difference(e, a, _json_path(where, index))
            if found is not None:
                return found
        return None
    if _close(expected, actual):
        return None
    return f"{at}: golden {json.dumps(expected)}, actual {json.dumps(actual)}"


def _close(expected: object, actual: object) -> bool:
    """Equal scalars: exact, except that two numbers of which one is a float agree within a tight tolerance."""
    numbers = (int, float)
    if isinstance(expected, bool) or isinstance(actual, bool) or not isinstance(expected, numbers):
        return type(expected) is type(actual) and expected == actual
    if not isinstance(actual, numbers):
        return False
    if isinstance(expected, int) and isinstance(actual, int):
        return expected == actual
    e, a = float(expected), float(actual)
    if math.isnan(e) or math.isnan(a):
        return math.isnan(e) and math.isnan(a)
    return math.isclose(e, a, rel_tol=1e-9, abs_tol=1e-12)


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
