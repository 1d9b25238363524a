"""Calibration: a table fitted from measurements reproduces them, scales the fallback, and feeds simulate."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

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
from opgraph.ir import (
    DType,
    Elementwise,
    Gemm,
    GraphMetadata,
    OpGraph,
    OpKind,
    Span,
    Timeline,
    TimelineKind,
    TimelineSource,
)
from tests.conftest import cli_runner, one_error_line
from validators import ReplayResult, ReplayStatus, replay_graph

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
    # every timing fitted as measured, settled or not (a busy machine may leave some unsettled)
    res = runner.invoke(app, ["calibrate", str(replay), "--hardware", "cpu", "--keep-unconverged", "-o", str(out)])
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


# ---------------------------------------------------------------- calibrate: what the replays are


def _rows(key: str) -> int:
    """A shape of its own per result: ``k3`` has 3 + 8 rows, any other key 64."""
    return int(key[1:]) + 8 if key[1:].isdigit() else 64


def _result(
    key: str, median_us: float, device: str = "cpu", name: str = "Intel Xeon", samples: int = 0
) -> ReplayResult:
    from tests.ir_builders import mm
    from validators.timing import summarize

    if samples:  # an unsettled timing: few samples, spread 30% or more
        xs = [median_us * f for f in (0.7, 1.0, 1.3, 0.8, 1.2, 1.0, 0.75, 1.25, 1.0)[:samples]]
    else:
        xs = [median_us * f for f in (1.0, 1.01, 0.99, 1.0, 1.005)]
    return ReplayResult(
        key=key, definition=f"gemm_{key}", kind=OpKind.GEMM, dtype=DType.bf16, op=mm(0, _rows(key), 8, 16),
        status=ReplayStatus.OK, device=device, device_name=name, timing=summarize(xs),
    )  # fmt: skip


def _write(path: Path, results: list[ReplayResult]) -> Path:
    from validators import ResultWriter

    with ResultWriter(path, fsync=False) as w:
        for r in results:
            w.write(r)
    return path


def _calibrate(*args: str | Path) -> Result:
    return cli_runner().invoke(app, ["calibrate", *map(str, args)])


@pytest.mark.parametrize(
    ("device", "name", "hardware", "message", "hint"),
    [
        ("cpu", "Intel Xeon", "h100", "replayed on the CPU (Intel Xeon), not on h100-sxm, a GPU", "give -H cpu"),
        ("cuda:0", "NVIDIA H200", "h100", "replayed on NVIDIA H200 (h200), not on h100-sxm", "give -H h200"),
        ("cuda:0", "NVIDIA H100 80GB HBM3", "h200", "(h100-sxm), not on h200", "give -H h100-sxm"),
        ("cuda:0", "NVIDIA H100 80GB HBM3", "cpu", "not on xeon-8480, a CPU", "--device cpu"),
    ],
)
def test_calibrate_refuses_replays_of_another_device(
    tmp_path: Path, device: str, name: str, hardware: str, message: str, hint: str
) -> None:
    replay = _write(tmp_path / "r.jsonl", [_result(f"k{i}", 20.0, device, name) for i in range(3)])
    out = tmp_path / "cal.json"
    line = one_error_line(_calibrate(replay, "-H", hardware, "-o", out))
    assert line.startswith("error: --hardware: the results were ") and message in line and hint in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("device", "name", "hardware"),
    [
        ("cuda:0", "NVIDIA H100 80GB HBM3", "h100"),
        ("cuda:0", "NVIDIA H200", "h200"),
        ("cpu", "Intel Xeon", "cpu"),
        ("cuda:0", "Some Future GPU", "h100"),  # a GPU the catalog does not know: nothing tells
    ],
)
def test_calibrate_takes_replays_of_the_device(tmp_path: Path, device: str, name: str, hardware: str) -> None:
    replay = _write(tmp_path / "r.jsonl", [_result(f"k{i}", 20.0, device, name) for i in range(3)])
    res = _calibrate(replay, "-H", hardware, "-o", tmp_path / "cal.json")
    assert res.exit_code == 0, res.output + res.stderr


def test_calibrate_names_a_file_that_is_not_replay_results(tmp_path: Path) -> None:
    from opgraph.ir import save_graph
    from tests.ir_builders import mm

    graph = save_graph(OpGraph(metadata=GraphMetadata(model="m"), ops=(mm(0, 4, 8, 16),)), tmp_path / "g.json")
    line = one_error_line(_calibrate(graph, "-H", "cpu", "-o", tmp_path / "cal.json"))
    assert f"error: {graph}: is an op graph (`opgraph capture`), not replay results" in line
    other = tmp_path / "other.jsonl"
    other.write_text('{"a": 1}\n{"a": 2}\n')
    line = one_error_line(_calibrate(other, "-H", "cpu", "-o", tmp_path / "cal.json"))
    assert "is JSON lines of a JSON object (keys a), not replay results" in line
    collectives = tmp_path / "coll.jsonl"
    collectives.write_text('{"collective": "all_reduce", "group_size": 2, "bytes": 4}\n')
    line = one_error_line(_calibrate(collectives, "-H", "cpu", "-o", tmp_path / "cal.json"))
    assert "is collective measurements" in line and "--collectives" in line
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "is an empty file" in one_error_line(_calibrate(empty, "-H", "cpu", "-o", tmp_path / "cal.json"))


def test_calibrate_warns_of_skipped_lines(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.jsonl", [_result(f"k{i}", 20.0) for i in range(4)]).read_text().splitlines()
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([good[0], "{not json", good[1], '{"key": "x"}', good[2], good[3][:50]]))
    res = _calibrate(mixed, "-H", "cpu", "-o", tmp_path / "cal.json")
    assert res.exit_code == 0, res.output + res.stderr
    warned = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1
    assert "skipped 3 line(s) that are not replay results (the first is line 2)" in warned[0]
    assert "from 3 measured configs" in " ".join(res.stdout.split())


def test_calibrate_leaves_unsettled_timings_out_unless_kept(tmp_path: Path) -> None:
    from hardware import CostTable

    settled = [_result(f"k{i}", 20.0) for i in range(3)]
    noisy = _result("noisy", 6035.0, samples=9)  # a ~20 us op timed at 6 ms, spread 30%+
    assert noisy.timing is not None and noisy.timing.instability
    replay = _write(tmp_path / "r.jsonl", [*settled, noisy])
    out = tmp_path / "cal.json"
    res = _calibrate(replay, "-H", "cpu", "-o", out)
    assert res.exit_code == 0, res.output + res.stderr
    assert "1 of 4 timings did not settle, left out of the fit: gemm_noisy (median ±" in res.stderr
    table = CostTable.load(out)
    assert sorted(e.shape["m"] for e in table.entries) == [8, 9, 10]
    assert any(n.startswith("1 unsettled timing(s) left out") and "gemm_noisy" in n for n in table.notes)
    res = _calibrate(replay, "-H", "cpu", "--keep-unconverged", "-o", out)
    assert res.exit_code == 0, res.output + res.stderr
    table = CostTable.load(out)
    assert sorted(e.shape["m"] for e in table.entries) == [8, 9, 10, 64]
    assert any("fitted as measured (--keep-unconverged)" in n for n in table.notes)
    only = _write(tmp_path / "noisy.jsonl", [noisy])
    line = one_error_line(_calibrate(only, "-H", "cpu", "-o", out))
    assert "all 1 timed results are unsettled" in line and "--keep-unconverged" in line
