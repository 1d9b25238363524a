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


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _users_folder(tmp_path: Path, summary: str) -> Path:
    """A folder of the user's own data that happens to hold a ``summary.json``."""
    out = tmp_path / "out"
    (out / "raw").mkdir(parents=True)
    (out / "summary.json").write_text(summary)
    (out / "results.csv").write_text("step,loss\n1,0.5\n")
    (out / "raw" / "run1.bin").write_bytes(b"\x00\x01")
    return out


@pytest.mark.parametrize(
    "summary",
    [
        '{"total": 3, "passed": true}',  # another tool's summary
        "not json at all",
    ],
)
def test_run_refuses_a_folder_whose_summary_is_not_a_runs(tmp_path: Path, summary: str) -> None:
    # QA: `opgraph run SCENARIO -o DIR` deleted any folder holding a file named summary.json.
    from conftest import cli_runner, one_error_line

    from opgraph.cli.app import app

    out = _users_folder(tmp_path, summary)
    before = _tree(out)
    err = one_error_line(cli_runner().invoke(app, ["run", str(_scenario(tmp_path, "")), "-o", str(out), "--no-report"]))
    assert "not an earlier run's" in err and str(out) in err and "new or empty folder" in err
    assert _tree(out) == before
    assert _leftovers(tmp_path) == []


def test_run_refuses_an_earlier_runs_folder_with_other_files_added(tmp_path: Path) -> None:
    # A real run's summary.json is not enough: every file beside it must be one it lists.
    from conftest import cli_runner, one_error_line

    from opgraph.cli.app import app

    out = tmp_path / "out"
    path = _scenario(tmp_path, "")
    assert cli_runner().invoke(app, ["run", str(path), "-o", str(out), "--no-report"]).exit_code == 0
    (out / "my-notes.txt").write_text("mine")
    before = _tree(out)
    err = one_error_line(cli_runner().invoke(app, ["run", str(path), "-o", str(out), "--no-report"]))
    assert "my-notes.txt" in err and "not an earlier run's" in err
    assert _tree(out) == before


def test_run_replaces_a_real_earlier_runs_folder(tmp_path: Path) -> None:
    from conftest import cli_runner

    from opgraph.cli.app import app

    out = tmp_path / "out"
    first = _scenario(tmp_path, "", engines='"1..3"')
    assert cli_runner().invoke(app, ["run", str(first), "-o", str(out), "--no-report"]).exit_code == 0
    assert (out / f"{GRAPH.split('.graph')[0]}.3eng.timeline.json.gz").is_file()
    second = _scenario(tmp_path, "", engines="[1]")
    res = cli_runner().invoke(app, ["run", str(second), "-o", str(out), "--no-report"])
    assert res.exit_code == 0, res.stderr
    listed = json.loads((out / "summary.json").read_text())["artefacts"]
    assert sorted(_tree(out)) == sorted(listed)  # the second run's files only
    assert _leftovers(tmp_path) == []


def test_files_written_into_the_folder_during_a_run_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The folder is checked again right before the swap: a file the user saved into it meanwhile
    # makes the run stop with the one-line error, the earlier run and the new file as they were.
    out = tmp_path / "out"
    run_scenario(_scenario(tmp_path, ""), out, reports=False)
    real_check_phase = opgraph.scenario.runner.check_phase

    def user_saves_a_file(*args: object, **kwargs: object) -> object:
        (out / "saved-meanwhile.txt").write_text("mine")
        return real_check_phase(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(opgraph.scenario.runner, "check_phase", user_saves_a_file)
    before_names = sorted(p.name for p in out.iterdir())
    with pytest.raises(ScenarioError, match=r"saved-meanwhile\.txt"):
        run_scenario(_scenario(tmp_path, ""), out, reports=False)
    assert sorted(p.name for p in out.iterdir()) == sorted([*before_names, "saved-meanwhile.txt"])
    assert (out / "saved-meanwhile.txt").read_text() == "mine"
    assert _leftovers(tmp_path) == []


def test_summary_files_recognises_only_this_tools_summaries(tmp_path: Path) -> None:
    from opgraph.scenario.folder import summary_files
    from opgraph.scenario.validation import ValidationStep, ValidationSummary

    out = tmp_path / "out"
    summary = run_scenario(_scenario(tmp_path, ""), out, reports=False)
    assert summary_files((out / "summary.json").read_text()) == frozenset(summary.artefacts)
    val = ValidationSummary(model="m", device="cpu", hardware="cpu",
                            steps=(ValidationStep(name="replay", done=True, files=("replay.jsonl",)),))  # fmt: skip
    assert summary_files(val.model_dump_json()) == {"summary.json", "replay.jsonl"}
    for foreign in ('{"artefacts": ["a"]}', "[1, 2]", '{"model": "m"}', ""):
        assert summary_files(foreign) is None
