"""Calibration: a table fitted from measurements reproduces them, scales the fallback, and feeds simulate."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hardware import (
    CalibrationError,
    Measurement,
    RooflineModel,
    TableModel,
    fit_cost_table,
    host_overhead_from_trace,
    load_hardware,
)
from opgraph.cli.app import app
from opgraph.ir import Elementwise, Gemm, OpKind, Span, Timeline, TimelineKind, TimelineSource
from validators import replay_graph

H100 = load_hardware("h100")


def _gemms(scale: float) -> list[Measurement]:
    model = RooflineModel()
    out = []
    for i, m in enumerate((256, 512, 1024, 2048)):
        op = Gemm(id=i, m=m, n=4096, k=4096)
        out.append(Measurement(op, model.estimate(op, H100).seconds * scale, host_seconds=12e-6))
    return out


def test_exact_entries_come_back_and_host_is_fitted() -> None:
    ms = _gemms(1.3)
    table = fit_cost_table(ms, H100)
    model = TableModel(table)
    for m in ms:
        cost = model.estimate(m.op, table.hardware or H100)
        assert cost.seconds == pytest.approx(m.seconds)
        assert cost.host_s == pytest.approx(12e-6)
    assert table.hardware is not None and table.hardware.host.eager_us == pytest.approx(12.0)
    assert any("gemm: roofline x1.3" in n for n in table.notes)


@settings(max_examples=20, deadline=None)
@given(st.floats(0.3, 3.0))
def test_unmeasured_definitions_inherit_the_kind_scale(scale: float) -> None:
    table = fit_cost_table(_gemms(scale), H100)
    other = Gemm(id=9, m=777, n=1024, k=8192)  # a definition the table never saw
    fitted = TableModel(table).estimate(other, table.hardware or H100).seconds
    base = RooflineModel().estimate(other, H100).seconds
    assert fitted == pytest.approx(base * scale, rel=0.02)


def test_no_usable_measurements() -> None:
    with pytest.raises(CalibrationError, match="no usable measurements"):
        fit_cost_table([Measurement(Gemm(id=0, m=1, n=1, k=1), 0.0)], H100)


def test_host_overhead_from_trace() -> None:
    spans = [
        Span(name="cudaLaunchKernel", track="cpu/1", start_us=10.0 * i, dur_us=3, category="runtime") for i in range(20)
    ]
    spans.append(
        Span(name="cudaLaunchKernel", track="cpu/1", start_us=5000, dur_us=3, category="runtime")
    )  # after a sync
    t = Timeline(source=TimelineSource(kind=TimelineKind.MEASURED), spans=tuple(spans))
    assert host_overhead_from_trace(t) == pytest.approx(10.0)
    with pytest.raises(CalibrationError, match="no kernel-launch runtime events"):
        host_overhead_from_trace(Timeline(source=TimelineSource(kind=TimelineKind.MEASURED)))


def test_calibrate_cli_from_cpu_replay_then_simulate(tmp_path: Path) -> None:
    """Replay on the CPU, calibrate for the CPU host entry, simulate with the table: ops cost what was measured."""
    from tests_replay_graph import small_graph

    from opgraph.ir import save_graph
    from validators import ResultWriter

    graph = small_graph()
    gpath = save_graph(graph, tmp_path / "g.json")
    replay = tmp_path / "replay.jsonl"
    with ResultWriter(replay) as w:
        for r in replay_graph(graph, device="cpu"):
            w.write(r)
    runner = CliRunner(env={"COLUMNS": "120"})
    out = tmp_path / "cpu-calibrated.json"
    res = runner.invoke(app, ["calibrate", str(replay), "--hardware", "cpu", "-o", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    assert "roofline x" in res.output and out.exists()
    sim = tmp_path / "sim.json"
    res = runner.invoke(
        app, ["simulate", str(gpath), "--hardware", str(out), "--cost-model", str(out), "-e", "1", "-o", str(sim)]
    )
    assert res.exit_code == 0, res.output + res.stderr
    from opgraph.ir import load_timeline
    from validators import load_results

    measured = {r.key: r for r in load_results(replay)}
    assert measured
    timeline = load_timeline(sim)
    by_def: dict[str, float] = {}
    for r in measured.values():
        if r.timing is not None:
            by_def[r.definition] = r.timing.median_us
    device = [s for s in timeline.spans if s.kind is not None and s.kind is not OpKind.VIEW and s.track != "host"]
    assert device
    for s in device:
        assert s.definition in by_def
        assert s.dur_us == pytest.approx(by_def[s.definition], rel=1e-6)


def test_calibrate_cli_bad_input(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text("")
    res = CliRunner().invoke(app, ["calibrate", str(p), "--hardware", "h100", "-o", str(tmp_path / "o.json")])
    assert res.exit_code == 2 and "error:" in res.stderr and not (tmp_path / "o.json").exists()


def test_elementwise_launch_refit() -> None:
    ms = [Measurement(Elementwise(id=i, fn="add", numel=64 * (i + 1)), 4e-6) for i in range(5)]
    table = fit_cost_table(ms, H100)
    assert table.hardware is not None and table.hardware.launch_latency_us == pytest.approx(4.0)
