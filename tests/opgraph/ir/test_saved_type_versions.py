"""The saved types that gained a ``schema_version`` after files of them were written (and some are written by
hand): hardware specs, replay results, simulation configs and statistics, engine sweeps, report tables,
scenarios and their summaries, coverage reports.

Each is written with its version, read back; a file without one (from an older opgraph, or a user's own)
still reads; a newer version is one line naming the file that says to upgrade, from the library and from
the CLI (exit 2); ``opgraph schema`` lists the version as optional.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import cli_runner, one_error_line
from pydantic import BaseModel

from hardware import HardwareSpec, load_hardware
from hardware.loader import load_hardware_file
from opgraph.cli.app import app
from opgraph.export import ReportTable
from opgraph.ir import (
    Edge,
    Gemm,
    GraphMetadata,
    LoadError,
    Norm,
    OpGraph,
    SchemaVersionError,
    Stage,
    load_model,
    save_graph,
    save_model,
)
from opgraph.ir.io import schema_versions
from opgraph.scenario import ScenarioSummary, load_scenario
from opgraph.scenario.folder import summary_files
from simulators import EngineSweep, FixedCostModel, SimulationConfig, SimulationStats, SweepPoint, simulate
from validators.coverage import CoverageReport, OperatorCoverage
from validators.results import ReplayResult, ReplayStatus, ResultWriter, TimingStats, load_results

HW = HardwareSpec(name="toy", memory_bytes=1e9, memory_bandwidth=1e11)


def _graph() -> OpGraph:
    ops = (Norm(id=0, rows=8, hidden=64, layer=0, stage=Stage.PREFILL), Gemm(id=1, m=8, n=64, k=64, layer=0))
    return OpGraph(metadata=GraphMetadata(model="tiny", phase="prefill"), ops=ops, edges=(Edge(src=0, dst=1),))


def _stats() -> SimulationStats:
    return simulate(_graph(), HW, FixedCostModel(default_us=5.0)).stats()


def _sweep() -> EngineSweep:
    points = (
        SweepPoint(engines=1, makespan_us=10.0, speedup=1.0, utilization=1.0),
        SweepPoint(engines=2, makespan_us=6.0, speedup=1.6, utilization=0.8),
    )
    return EngineSweep(points=points, best_makespan_us=6.0, tolerance=0.01, recommended=2, critical_path_us=5.0)


def _summary() -> ScenarioSummary:
    return ScenarioSummary(
        name="s", file="s.scenario.toml", hardware="h100", cost_model="roofline", policy="earliest", host="eager",
        tp=1, phases=(), expectations=(), passed=True, artefacts=("report.html",),
    )  # fmt: skip


def _coverage() -> CoverageReport:
    rms = OperatorCoverage(operator="rmsnorm", required=True, count=1, definitions={"rmsnorm_h64": 1})
    return CoverageReport(
        model="tiny", family="llama", total_definitions=1, total_ops=1, operators=(rms,), unmatched={}
    )


BUILDERS: dict[str, Callable[[], BaseModel]] = {
    "hardware": lambda: HW,
    "simulation_config": lambda: SimulationConfig.standard(2),
    "simulation_stats": _stats,
    "engine_sweep": _sweep,
    "report_table": lambda: ReportTable(title="t", columns=("op", "us"), rows=(("gemm", 1.5),)),
    "scenario_summary": _summary,
    "coverage_report": _coverage,
}
"""A saved JSON file of each type (replay results are JSON lines and scenarios TOML: tested apart below)."""


@pytest.fixture(params=sorted(BUILDERS))
def saved(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, BaseModel, Path]:
    """(schema name, the model, the file it was saved to)."""
    name: str = request.param
    obj = BUILDERS[name]()
    return name, obj, save_model(obj, tmp_path / f"{name}.json")


def _rewrite(path: Path, **changes: object) -> dict[str, object]:
    """The saved file with ``changes`` (``None``: drop the key) written back; the raw table."""
    raw: dict[str, object] = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    path.write_text(json.dumps(raw))
    return raw


def _one_line(exc: Exception, path: Path) -> str:
    assert isinstance(exc, LoadError)
    line = exc.one_line()
    assert "\n" not in line and str(path) in line, line
    return line


def test_saved_with_its_version_and_read_back(saved: tuple[str, BaseModel, Path]) -> None:
    name, obj, path = saved
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 1
    if name != "coverage_report":  # a coverage report starts with the graph's identity (GraphIdentity)
        assert next(iter(raw)) == "schema_version"
    assert load_model(path, type(obj)) == obj
    assert schema_versions(type(obj)) == (1,)


def test_a_file_written_before_versions_still_reads(saved: tuple[str, BaseModel, Path]) -> None:
    _, obj, path = saved
    _rewrite(path, schema_version=None)
    assert load_model(path, type(obj)) == obj


@pytest.mark.parametrize(("version", "words"), [(2, "schema_version 2 is newer"), (0, "schema_version 0 is older")])
def test_another_version_is_one_line_naming_the_file(
    saved: tuple[str, BaseModel, Path], version: int, words: str
) -> None:
    _, obj, path = saved
    _rewrite(path, schema_version=version)
    with pytest.raises(SchemaVersionError) as info:
        load_model(path, type(obj))
    line = _one_line(info.value, path)
    assert words in line and ("upgrade opgraph" in line) == (version == 2)


def test_the_schema_command_has_the_version_and_it_is_optional(saved: tuple[str, BaseModel, Path]) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks saved files against the schema")
    name, _, path = saved
    res = cli_runner().invoke(app, ["schema", name])
    assert res.exit_code == 0, res.output
    schema = json.loads(res.stdout)
    assert schema["properties"]["schema_version"]["const"] == 1
    assert "schema_version" not in schema.get("required", [])
    raw = json.loads(path.read_text())
    jsonschema.validate(raw, schema)  # an independent reader of the schema accepts what opgraph saves
    jsonschema.validate({k: v for k, v in raw.items() if k != "schema_version"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**raw, "schema_version": 2}, schema)


UNVERSIONED_READ = {
    "hardware", "replay_result", "simulation_config", "simulation_stats", "engine_sweep", "report_table", "scenario",
    "scenario_summary", "coverage_report",
}  # fmt: skip
"""The types whose files may leave the version out (the README's list)."""


def test_every_type_the_schema_command_lists_has_a_version() -> None:
    from opgraph.cli.commands.schema import SAVED_TYPES
    from opgraph.ir import FrozenModel, import_object

    for name, spec in SAVED_TYPES.items():
        cls = import_object(spec)
        assert isinstance(cls, type) and issubclass(cls, FrozenModel), name
        assert schema_versions(cls), f"{name} has no schema_version"
        assert cls.reads_unversioned == (name in UNVERSIONED_READ), name


# ---------------------------------------------------------------- TOML written by hand: hardware specs, scenarios
TOML = 'name = "mine"\nmemory_bytes = "16 GiB"\nmemory_bandwidth = "500 GB/s"\n'
SCENARIO = '[[phases]]\ngraph = "g.json"\n'
HAND_WRITTEN: dict[str, tuple[str, str, Callable[[Path], BaseModel]]] = {
    "hardware spec": ("mine.toml", TOML, load_hardware_file),
    "scenario": ("s.scenario.toml", SCENARIO, load_scenario),
}
"""Kinds users write by hand: (file name, a minimal text, the loader)."""


@pytest.mark.parametrize("kind", sorted(HAND_WRITTEN))
def test_a_hand_written_file_needs_no_version(tmp_path: Path, kind: str) -> None:
    name, text, load = HAND_WRITTEN[kind]
    path = tmp_path / name
    path.write_text(text)
    plain = load(path)
    assert getattr(plain, "schema_version") == 1  # noqa: B009
    path.write_text("schema_version = 1\n" + text)
    assert load(path) == plain


@pytest.mark.parametrize("kind", sorted(HAND_WRITTEN))
def test_a_newer_hand_written_file_is_one_line(tmp_path: Path, kind: str) -> None:
    name, text, load = HAND_WRITTEN[kind]
    path = tmp_path / name
    path.write_text("schema_version = 2\n" + text)
    with pytest.raises(SchemaVersionError) as info:
        load(path)
    assert "schema_version 2 is newer than this opgraph's 1 (upgrade opgraph" in _one_line(info.value, path)


def test_a_hardware_spec_reads_back_as_json_and_a_derived_one_is_checked_first(tmp_path: Path) -> None:
    toml = tmp_path / "mine.toml"
    toml.write_text(TOML)
    plain = load_hardware_file(toml)
    as_json = tmp_path / "mine.json"
    as_json.write_text(plain.model_dump_json())  # what `opgraph hardware show --json` prints, read back
    assert json.loads(as_json.read_text())["schema_version"] == 1
    assert load_hardware_file(as_json) == plain
    derived = tmp_path / "derived.toml"
    derived.write_text('base = "h100"\nschema_version = 3\n')  # refused before the catalog entry is merged in
    with pytest.raises(SchemaVersionError, match="schema_version 3 is newer"):
        load_hardware(str(derived))


def test_a_cost_table_carries_its_spec_with_its_version(tmp_path: Path) -> None:
    from hardware import CostTable

    table = CostTable(hardware=HW).save(tmp_path / "cal.json")
    assert json.loads(table.read_text())["hardware"]["schema_version"] == 1
    assert load_hardware_file(table) == HW
    raw = json.loads(table.read_text())
    raw["hardware"]["schema_version"] = 2
    table.write_text(json.dumps(raw))
    with pytest.raises(SchemaVersionError, match=r"cal.json \(hardware\): schema_version 2 is newer"):
        load_hardware_file(table)


# ---------------------------------------------------------------- replay results: JSON lines
def _result(key: str) -> ReplayResult:
    timing = TimingStats(median_us=10.0, iqr_us=0.1, mad_us=0.1, spread=0.01, min_us=9.9, mean_us=10.0, samples=5)
    op = Gemm(id=0, m=8, n=64, k=64)
    return ReplayResult(
        key=key, definition=op.definition, kind=op.kind, dtype=op.dtype, op=op, status=ReplayStatus.OK,
        device="cpu", timing=timing,
    )  # fmt: skip


def _replay_file(tmp_path: Path, *keys: str) -> Path:
    path = tmp_path / "r.jsonl"
    with ResultWriter(path, fsync=False) as w:
        for key in keys:
            w.write(_result(key))
    return path


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write_lines(path: Path, records: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_replay_results_are_written_with_their_version(tmp_path: Path) -> None:
    path = _replay_file(tmp_path, "a", "b")
    assert all(next(iter(r)) == "schema_version" and r["schema_version"] == 1 for r in _lines(path))
    assert "version" not in _lines(path)[0]
    assert load_results(path) == [_result("a"), _result("b")]


def test_replay_results_from_before_versions_still_read(tmp_path: Path) -> None:
    # the records replay wrote before carried `"version": 1` in the place of schema_version; older ones nothing
    path = _replay_file(tmp_path, "a", "b")
    old = _lines(path)
    old[0] = {("version" if k == "schema_version" else k): v for k, v in old[0].items()}
    del old[1]["schema_version"]
    _write_lines(path, old)
    skipped: list[int] = []
    assert load_results(path, strict=True, skipped=skipped) == [_result("a"), _result("b")] and skipped == []


@pytest.mark.parametrize("strict", [True, False])
def test_a_newer_replay_record_is_one_line_not_a_skipped_line(tmp_path: Path, strict: bool) -> None:
    path = _replay_file(tmp_path, "a", "b")
    records = _lines(path)
    records[1]["schema_version"] = 2
    _write_lines(path, records)
    with pytest.raises(SchemaVersionError) as info:
        load_results(path, strict=strict)
    line = _one_line(info.value, path)
    assert f"{path}: line 2: schema_version 2 is newer than this opgraph's 1 (upgrade opgraph to read it)" == line


def test_calibrate_refuses_newer_replay_results_in_one_line(tmp_path: Path) -> None:
    path = _replay_file(tmp_path, "a")
    _write_lines(path, [{**_lines(path)[0], "schema_version": 2}])
    res = cli_runner().invoke(app, ["calibrate", str(path), "-H", "cpu", "-o", str(tmp_path / "cal.json")])
    line = one_error_line(res)
    assert f"{path}: line 1: schema_version 2 is newer" in line and "upgrade opgraph" in line


def test_a_newer_scenario_summary_is_not_taken_for_one() -> None:
    raw = json.loads(_summary().model_dump_json())
    assert summary_files(json.dumps(raw)) == frozenset({"summary.json", "report.html"})
    del raw["schema_version"]  # a run's folder from before summaries carried a version is still its own
    assert summary_files(json.dumps(raw)) == frozenset({"summary.json", "report.html"})
    raw["schema_version"] = 2
    assert summary_files(json.dumps(raw)) is None


# ---------------------------------------------------------------- the CLI: exit 2, one line, no traceback
@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    return save_graph(_graph(), tmp_path / "g.json")


def test_simulate_refuses_a_newer_config(tmp_path: Path, graph_file: Path) -> None:
    config = save_model(SimulationConfig.standard(2), tmp_path / "config.json")
    ok = cli_runner().invoke(app, ["simulate", str(graph_file), "--config", str(config), "-H", "h100"])
    assert ok.exit_code == 0, ok.output
    _rewrite(config, schema_version=None)  # a config written by hand, or before configs carried a version
    ok = cli_runner().invoke(app, ["simulate", str(graph_file), "--config", str(config), "-H", "h100"])
    assert ok.exit_code == 0, ok.output
    _rewrite(config, schema_version=2)
    res = cli_runner().invoke(app, ["simulate", str(graph_file), "--config", str(config), "-H", "h100"])
    line = one_error_line(res)
    assert f"{config}: schema_version 2 is newer than this opgraph's 1 (upgrade opgraph to read it)" in line


def test_simulate_refuses_a_newer_hardware_file(tmp_path: Path, graph_file: Path) -> None:
    spec = tmp_path / "mine.toml"
    spec.write_text("schema_version = 2\n" + TOML)
    line = one_error_line(cli_runner().invoke(app, ["simulate", str(graph_file), "-H", str(spec)]))
    assert f"{spec}: schema_version 2 is newer" in line and "upgrade opgraph" in line


def test_run_refuses_a_newer_scenario(tmp_path: Path, graph_file: Path) -> None:
    path = tmp_path / "s.scenario.toml"
    path.write_text("schema_version = 2\n" + SCENARIO)
    line = one_error_line(cli_runner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out"), "--no-report"]))
    assert f"{path}: schema_version 2 is newer" in line and "upgrade opgraph" in line
