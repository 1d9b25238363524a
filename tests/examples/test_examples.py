"""Every script in ``examples/`` runs on the CPU and prints what its golden file says.

The golden outputs live in ``tests/golden/examples/<name>.out``; regenerate them with
``OPGRAPH_UPDATE_GOLDEN=1`` after an intended change. Each example runs in this process (torch is
imported once) with ``sys.argv`` set as if run from the command line with no arguments.
"""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

import pytest

from tests.conftest import CAPTURED_WITH, check_golden, skip_unless_captured_with

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.py"))


def test_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {
        "llama_8b_engines",
        "best_engine_count",
        "custom_cost_model",
        "compare_measured",
        "tp2_llama_70b_decode",
        "replay_and_calibrate",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_has_docstring_and_main_guard(path: Path) -> None:
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    assert doc and "Scenario" in doc, f"{path.name}: the docstring must say what it covers and the scenario"
    assert 'if __name__ == "__main__":' in path.read_text(), f"{path.name}: runnable as a script"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_output_matches_golden(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", [str(path)])
    monkeypatch.chdir(REPO)
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert out.strip(), f"{path.name} printed nothing"
    if "opgraph.capture" in path.read_text():  # its numbers rest on a capture: they are that release's
        skip_unless_captured_with(CAPTURED_WITH, f"{path.name}'s golden output")
    check_golden(f"examples/{path.stem}.out", out)


def test_example_output_is_deterministic(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # The cheapest example twice in one process: a golden file only means something if reruns agree.
    path = REPO / "examples" / "compare_measured.py"
    monkeypatch.setattr(sys, "argv", [str(path)])
    runs = []
    for _ in range(2):
        runpy.run_path(str(path), run_name="__main__")
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1]
