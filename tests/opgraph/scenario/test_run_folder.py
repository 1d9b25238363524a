"""A run's folder never claims a result it did not produce: new runs swap in whole, failed runs leave it as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import opgraph.scenario.runner
from opgraph.scenario import ScenarioError, run_scenario

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "h100"
GRAPH = "llama-3.2-1b-l2-prefill256.graph.json.gz"


def _scenario(tmp_path: Path, expect: str, engines: str = "[1, 2]") -> Path:
    shutil.copy(DATA / GRAPH, tmp_path / GRAPH)
    path = tmp_path / "g.scenario.toml"
    path.write_text(f'[simulation]\nengines = {engines}\n[[phases]]\ngraph = "{GRAPH}"\n[expect]\n{expect}\n')
    return path


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _leftovers(tmp_path: Path) -> list[str]:
    return [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]


@pytest.mark.parametrize("failure", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_failed_rerun_leaves_the_earlier_run_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    out = tmp_path / "out"
    first = run_scenario(_scenario(tmp_path, "speedup = { min = 0.1 }"), out, reports=False)
    assert first.passed
    before = _snapshot(out)

    # The second run (more engines, so more files) fails after it has written some of them.
    path = _scenario(tmp_path, "speedup = { min = 0.1 }", engines='"1..4"')

    def fail(*args: object) -> None:
        partial = [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial-")]
        assert len(partial) == 1 and any(partial[0].iterdir())  # the new run has written files by now
        raise failure

    monkeypatch.setattr(opgraph.scenario.runner, "check_phase", fail)
    with pytest.raises(type(failure)):
        run_scenario(path, out, reports=False)
    assert _snapshot(out) == before
    assert json.loads(before["summary.json"])["passed"] is True
    assert _leftovers(tmp_path) == []


def test_a_rerun_replaces_the_whole_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_scenario(_scenario(tmp_path, "", engines='"1..3"'), out, reports=False)
    assert (out / f"{GRAPH.split('.graph')[0]}.3eng.timeline.json.gz").is_file()
    summary = run_scenario(_scenario(tmp_path, "makespan_us = { max = 1 }", engines="[1]"), out, reports=False)
    assert not summary.passed
    assert sorted(p.name for p in out.iterdir()) == sorted(summary.artefacts)  # nothing left of the first run
    assert json.loads((out / "summary.json").read_text())["passed"] is False
    assert _leftovers(tmp_path) == []


def test_a_folder_of_other_files_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ScenarioError, match="not an earlier run's"):
        run_scenario(_scenario(tmp_path, ""), out, reports=False)
    assert (out / "notes.txt").read_text() == "mine"
