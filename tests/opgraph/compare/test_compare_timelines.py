"""Comparison of timelines: op-id and definition joins, groupings, end-to-end rows, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.compare import CompareError, JoinMode, compare_timelines
from opgraph.ir import OpKind, Span, Stage, Timeline, TimelineKind, TimelineSource, save_timeline


def _tl(kind: TimelineKind, spans: list[Span], name: str, wall: float | None = None, model: str = "m") -> Timeline:
    return Timeline(source=TimelineSource(kind=kind, name=name, graph_model=model), spans=tuple(spans), wall_us=wall)


def _op_span(op_id: int, kind: OpKind, definition: str, track: str, start: float, dur: float, layer: int) -> Span:
    """The simulated span of prefill op ``op_id``, named after its kind."""
    return Span(
        name=kind.value, track=track, start_us=start, dur_us=dur, op_id=op_id, kind=kind, layer=layer,
        stage=Stage.PREFILL, definition=definition,
    )  # fmt: skip


def _sim() -> Timeline:
    spans = [
        _op_span(0, OpKind.GEMM, "gemm_n8_k8", "engine0", start=0, dur=10, layer=0),
        _op_span(1, OpKind.NORM, "rmsnorm_h8", "engine0", start=10, dur=5, layer=0),
        _op_span(2, OpKind.GEMM, "gemm_n8_k8", "engine1", start=15, dur=20, layer=1),
        Span(name="host", track="host", start_us=0, dur_us=3, category="host"),
    ]
    return _tl(TimelineKind.SIMULATED, spans, "sim", wall=40)


def _measured() -> Timeline:
    # Op 0 ran as two kernels; op 1 is missing from the measurement; op 9 was never simulated.
    spans = [
        Span(name="k_a", track="stream7", start_us=100, dur_us=6, op_id=0, category="gemm"),
        Span(name="k_b", track="stream7", start_us=106, dur_us=6, op_id=0, category="gemm"),
        Span(name="k_c", track="stream7", start_us=120, dur_us=16, op_id=2, category="gemm"),
        Span(name="k_d", track="stream7", start_us=140, dur_us=4, op_id=9, category="elementwise"),
        Span(name="aten::mm", track="thread1", start_us=90, dur_us=50, category="cpu_op"),
    ]
    return _tl(TimelineKind.MEASURED, spans, "h100", wall=50)


def test_op_id_join_sums_kernels_per_op() -> None:
    c = compare_timelines(_sim(), _measured())
    assert c.join is JoinMode.OP_ID
    assert c.matched == 2
    by_key = {e.key: e for e in c.ops}
    assert by_key["op 0"].reference_us == 12 and by_key["op 0"].predicted_us == 10
    assert by_key["op 2"].rel_error == pytest.approx(0.25)
    assert (c.unmatched_predicted, c.unmatched_reference) == (1, 1)
    assert c.unmatched_predicted_us == 5 and c.unmatched_reference_us == 4
    gpu = c.row("gpu_time")
    assert gpu.predicted_us == 35 and gpu.reference_us == 32  # host and CPU spans excluded
    assert c.row("wall_time").rel_error == pytest.approx(-0.2)
    # op 9 (reference only, no layer) is in the tables as unmatched time, so that each side adds up
    assert [g.group for g in c.by_layer] == ["0", "1", "-"]
    assert [(g.ops, g.unmatched_predicted_us, g.unmatched_reference_us) for g in c.by_layer] == [
        (1, 5, 0),
        (1, 0, 0),
        (0, 0, 4),
    ]
    assert sum(g.predicted_us for g in c.by_layer) == 35 and sum(g.reference_us for g in c.by_kind) == 32
    assert c.top_gaps[0].key == "op 2"
    assert c.median_abs_rel_error == pytest.approx(statistics_median([abs(10 / 12 - 1), 0.25]))


def statistics_median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def test_definition_join_matches_by_order() -> None:
    ref = _tl(
        TimelineKind.REPLAY,
        [
            Span(name="x", track="s", start_us=0, dur_us=9, definition="gemm_n8_k8"),
            Span(name="x", track="s", start_us=9, dur_us=22, definition="gemm_n8_k8"),
            Span(name="y", track="s", start_us=31, dur_us=5, definition="rmsnorm_h8"),
        ],
        "replay",
    )
    c = compare_timelines(_sim(), ref, join=JoinMode.DEFINITION)
    assert c.matched == 3
    assert {e.key: e.reference_us for e in c.ops} == {"gemm_n8_k8#0": 9, "gemm_n8_k8#1": 22, "rmsnorm_h8#0": 5}


def test_nothing_to_join_and_empty_and_other_model() -> None:
    other = _tl(TimelineKind.MEASURED, [Span(name="z", track="s", start_us=0, dur_us=1, category="quantization")], "x")
    with pytest.raises(CompareError, match="no op matched by definition: 3 predicted and 1 reference"):
        compare_timelines(_sim(), other, join=JoinMode.DEFINITION)
    # a measured timeline without op ids is a trace: compared end to end, saying how little matched
    c = compare_timelines(_sim(), other)
    assert c.join is JoinMode.TRACE and c.row("gpu_time").reference_us == 1.0
    assert c.matched_share == 0.0 and any("matched" in n for n in c.notes)
    with pytest.raises(CompareError, match="no device spans"):
        compare_timelines(_sim(), _tl(TimelineKind.MEASURED, [], "empty"))
    with pytest.raises(CompareError, match="different models"):
        compare_timelines(_sim(), _tl(TimelineKind.MEASURED, list(_measured().spans), "m2", model="other"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.1, 1000), min_size=1, max_size=20), st.floats(0.5, 2.0))
def test_scaled_prediction_gives_that_error_everywhere(durs: list[float], scale: float) -> None:
    ref = _tl(
        TimelineKind.MEASURED,
        [Span(name="k", track="s", start_us=10 * i, dur_us=d, op_id=i) for i, d in enumerate(durs)],
        "r",
    )
    pred = _tl(
        TimelineKind.SIMULATED,
        [Span(name="k", track="e", start_us=10 * i, dur_us=d * scale, op_id=i) for i, d in enumerate(durs)],
        "p",
    )
    c = compare_timelines(pred, ref)
    assert c.matched == len(durs)
    assert c.row("gpu_time").rel_error == pytest.approx(scale - 1, rel=1e-6, abs=1e-9)
    assert all(e.rel_error == pytest.approx(scale - 1, rel=1e-6, abs=1e-9) for e in c.ops)


def test_cli_compare_writes_json(tmp_path: Path) -> None:
    a = save_timeline(_sim(), tmp_path / "sim.json")
    b = save_timeline(_measured(), tmp_path / "meas.json.gz")
    out = tmp_path / "cmp.json"
    res = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["compare", str(a), str(b), "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "gpu_time" in res.output and "op 2" in res.output
    data = json.loads(out.read_text())
    assert data["matched"] == 2 and data["join"] == "op_id"


def test_cli_compare_bad_inputs(tmp_path: Path) -> None:
    a = save_timeline(_sim(), tmp_path / "sim.json")
    empty = tmp_path / "empty.json"
    empty.write_text("")
    r = CliRunner().invoke(app, ["compare", str(a), str(empty)])
    assert r.exit_code == 2 and "file is empty" in r.stderr and r.stderr.count("\n") == 1
    r = CliRunner().invoke(app, ["compare", str(a), str(a), "--join", "magic"])
    assert r.exit_code == 2 and "unknown join 'magic'" in r.stderr
    notl = tmp_path / "x.json"
    notl.write_text('{"a": 1}')
    r = CliRunner().invoke(app, ["compare", str(a), str(notl)])
    assert r.exit_code == 2 and "neither an opgraph timeline nor a profiler trace" in r.stderr


def test_cli_compare_writes_html_and_perfetto(tmp_path: Path) -> None:
    a = save_timeline(_sim(), tmp_path / "sim.json")
    b = save_timeline(_measured(), tmp_path / "meas.json")
    html, trace = tmp_path / "r.html", tmp_path / "both.json"
    res = CliRunner().invoke(app, ["compare", str(a), str(b), "--html", str(html), "--perfetto", str(trace)])
    assert res.exit_code == 0, res.output + res.stderr
    page = html.read_text()
    assert "Ops that explain most of the gap" in page and "gpu_time" in page
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert len(names) == 2  # both timelines, side by side
