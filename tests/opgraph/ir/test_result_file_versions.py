"""The result files that gained a ``schema_version``: a comparison (``opgraph compare --json``), the summary of
``opgraph validate`` and a serving result (``opgraph serve-sim -o``). Each is written with its version, read
back by :func:`opgraph.ir.load_model`, refused at another version with one line naming the file, listed by
``opgraph schema``, and named when given where a timeline is expected."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.compare import Comparison, compare_timelines
from opgraph.ir import (
    LoadError,
    OpgraphError,
    OpKind,
    SchemaVersionError,
    Span,
    Stage,
    Timeline,
    TimelineKind,
    TimelineSource,
    load_model,
    save_model,
    save_timeline,
)
from opgraph.ir.io import schema_versions
from opgraph.scenario.folder import earlier_run_files, summary_files
from opgraph.scenario.model import ScenarioError
from opgraph.scenario.validation import ValidationStep, ValidationSummary
from simulators.serving import Request, ServingResult, StepShape, get_scheduler, run_serving

ENV = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}


def _timelines() -> tuple[Timeline, Timeline]:
    def span(op_id: int, track: str, start: float, dur: float) -> Span:
        return Span(
            name="gemm", track=track, start_us=start, dur_us=dur, op_id=op_id, kind=OpKind.GEMM, layer=0,
            stage=Stage.PREFILL, definition="gemm_n8_k8",
        )  # fmt: skip

    sim = Timeline(
        source=TimelineSource(kind=TimelineKind.SIMULATED, name="sim", graph_model="m"),
        spans=(span(0, "engine0", 0, 10), span(1, "engine0", 10, 20)),
    )
    measured = Timeline(
        source=TimelineSource(kind=TimelineKind.MEASURED, name="gpu", graph_model="m"),
        spans=(span(0, "stream7", 100, 12), span(1, "stream7", 112, 16)),
    )
    return sim, measured


def _comparison() -> Comparison:
    return compare_timelines(*_timelines())


class _OneMsSteps:
    """1 ms a step, whatever it holds."""

    def step_us(self, shape: StepShape) -> float:
        return 1000.0


def _serving_result() -> ServingResult:
    requests = [Request(id=i, arrival_s=0.0, prompt_tokens=8, output_tokens=3) for i in range(2)]
    return run_serving(
        requests,
        get_scheduler("continuous"),
        _OneMsSteps(),
        max_batch=4,
        token_budget=64,
        kv_capacity_tokens=1000,
        kv_bytes_per_token=4,
    )


def _validation_summary() -> ValidationSummary:
    step = ValidationStep(name="compare", done=True, command="opgraph compare ...", files=("comparison.json",))
    return ValidationSummary(model="m", device="cpu", hardware="cpu", steps=(step,), gpu_time_err=0.1)


BUILDERS: dict[str, Callable[[], BaseModel]] = {
    "comparison": _comparison,
    "validation_summary": _validation_summary,
    "serving_result": _serving_result,
}


@pytest.fixture(params=sorted(BUILDERS))
def saved(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, BaseModel, Path]:
    """(schema name, the model, the file it was saved to)."""
    name: str = request.param
    obj = BUILDERS[name]()
    return name, obj, save_model(obj, tmp_path / f"{name}.json")


def _one_line(exc: OpgraphError, path: Path) -> str:
    line = exc.one_line()
    assert "\n" not in line and str(path) in line, line
    return line


def test_saved_with_its_version_and_read_back(saved: tuple[str, BaseModel, Path]) -> None:
    _, obj, path = saved
    raw = json.loads(path.read_text())
    assert next(iter(raw)) == "schema_version" and raw["schema_version"] == 1  # first, so a file's head tells
    assert load_model(path, type(obj)) == obj
    assert schema_versions(type(obj)) == (1,)


@pytest.mark.parametrize(("version", "words"), [(2, "schema_version 2 is newer"), (0, "schema_version 0 is older")])
def test_another_version_is_one_line_naming_the_file(
    saved: tuple[str, BaseModel, Path], version: int, words: str
) -> None:
    _, obj, path = saved
    raw = json.loads(path.read_text())
    raw["schema_version"] = version
    path.write_text(json.dumps(raw))
    with pytest.raises(SchemaVersionError) as info:
        load_model(path, type(obj))
    line = _one_line(info.value, path)
    assert words in line and ("upgrade opgraph" in line) == (version == 2)


def test_a_file_written_before_versions_says_so(saved: tuple[str, BaseModel, Path]) -> None:
    # files these commands wrote before this change have no schema_version: older, not "not a file of this kind"
    _, obj, path = saved
    raw = json.loads(path.read_text())
    del raw["schema_version"]
    path.write_text(json.dumps(raw))
    with pytest.raises(SchemaVersionError) as info:
        load_model(path, type(obj))
    line = _one_line(info.value, path)
    assert "without a schema_version" in line and "re-create" in line


def test_the_schema_command_lists_them_and_the_files_validate(saved: tuple[str, BaseModel, Path]) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks saved files against the schema")
    name, _, path = saved
    runner = CliRunner(env=ENV)
    res = runner.invoke(app, ["schema"])
    assert res.exit_code == 0 and name in json.loads(res.output)
    one = runner.invoke(app, ["schema", name])
    assert one.exit_code == 0, one.output
    schema = json.loads(one.output)
    assert schema["properties"]["schema_version"]["const"] == 1
    raw = json.loads(path.read_text())
    jsonschema.validate(raw, schema)  # an independent reader of the schema accepts what opgraph saves
    raw["schema_version"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(raw, schema)


@pytest.mark.parametrize(
    ("name", "words"),
    [("comparison", "is a comparison (`opgraph compare --json`)"), ("serving_result", "is a serving result")],
)
def test_given_as_a_timeline_it_is_named(tmp_path: Path, name: str, words: str) -> None:
    path = save_model(BUILDERS[name](), tmp_path / "x.json")
    res = CliRunner(env=ENV).invoke(app, ["export", str(path), "-o", str(tmp_path / "out.json")])
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.count("\n") == 0 and words in err and str(path) in err, err


def test_compare_json_writes_a_versioned_comparison(tmp_path: Path) -> None:
    sim, measured = _timelines()
    a, b = save_timeline(sim, tmp_path / "a.json"), save_timeline(measured, tmp_path / "b.json")
    out = tmp_path / "c.json"
    res = CliRunner(env=ENV).invoke(app, ["compare", str(a), str(b), "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["schema_version"] == 1
    assert load_model(out, Comparison).matched == 2


def test_a_validation_folder_from_before_versions_is_still_replaced(tmp_path: Path) -> None:
    """A new validation replaces an earlier one's folder: its summary.json without a schema_version still
    reads as one `opgraph validate` wrote; a newer summary is not taken for one."""
    summary = _validation_summary()
    folder = tmp_path / "out"
    folder.mkdir()
    raw = json.loads(summary.model_dump_json())
    del raw["schema_version"]
    (folder / "summary.json").write_text(json.dumps(raw))
    (folder / "comparison.json").write_text("{}")
    assert summary_files(json.dumps(raw)) == summary.files
    assert earlier_run_files(folder) == frozenset({"summary.json", "comparison.json"})
    raw["schema_version"] = 2
    (folder / "summary.json").write_text(json.dumps(raw))
    with pytest.raises(ScenarioError, match="not one `opgraph run` or `opgraph validate` writes"):
        earlier_run_files(folder)


def test_every_versioned_model_reads_its_own_versions() -> None:
    from opgraph.ir import GRAPH_SCHEMA_VERSIONS, OpGraph

    assert schema_versions(OpGraph) == GRAPH_SCHEMA_VERSIONS
    assert schema_versions(Timeline) == (1,)
    assert schema_versions(Request) == ()


def test_a_timeline_is_not_taken_for_a_comparison(tmp_path: Path) -> None:
    path = save_timeline(_timelines()[0], tmp_path / "t.json")
    with pytest.raises(LoadError, match="is a timeline, not a Comparison"):
        load_model(path, Comparison)
