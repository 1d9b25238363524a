"""Where the time goes in a comparison: every device microsecond of either side in some row, unmatched counts
that are real, one definition of wall time, and notes on ranks and stages (issue: compare dropped predicted
time silently and reported 0 unmatched).

The measured side is a small hand-written trace of two transformer layers, one step, as the trace
importer would have written it (kernels typed by name on a ``gpu0`` stream, host spans on a CPU thread);
the predicted side is a simulation-like timeline of the same model with op ids. Totals are checked
against sums written out here, not against the comparison's own numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.compare import CompareError, Comparison, JoinMode, compare_timelines
from opgraph.ir import OpKind, Span, Stage, Timeline, TimelineKind, TimelineSource, save_timeline

KERNEL = {
    "embedding": "indexSelectSmallIndex",
    "norm": "void at::native::rms_norm_kernel",
    "gemm": "nvjet_sm90_tst_64x8_TNT",
    "attention": "flash_fwd_kernel",
    "activation": "silu_kernel",
    "elementwise": "vectorized_elementwise_kernel<add>",
    "sampling": "argmax_kernel",
}
LAYER = ["norm", "gemm", "attention", "gemm", "elementwise", "norm", "gemm", "activation", "gemm", "elementwise"]
MEASURED_US = {
    "embedding": 3.0, "norm": 4.0, "gemm": 20.0, "attention": 9.0, "activation": 5.0, "elementwise": 2.0,
    "sampling": 6.0, "memcpy": 7.0,
}  # fmt: skip
PREDICTED_US = {
    "embedding": 2.0, "norm": 3.0, "gemm": 25.0, "attention": 8.0, "activation": 4.0, "elementwise": 1.0,
    "topk": 5.0, "rope": 1.5, "other": 0.5,
}  # fmt: skip


def measured(*, stage_annotation: str | None = None, host: bool = True) -> Timeline:
    """Embedding, two layers (a copy in layer 1 that the simulation has no op for), final norm, LM head and
    sampling, one kernel after the other from 100 us; a CPU op from 0 us (the host starts first)."""
    kinds = ["embedding", *LAYER, *LAYER[:5], "memcpy", *LAYER[5:], "norm", "gemm", "sampling"]
    spans: list[Span] = []
    t = 100.0
    for k in kinds:
        name = "Memcpy DtoD (Device -> Device)" if k == "memcpy" else KERNEL[k]
        spans.append(Span(name=name, track="gpu0/stream7", start_us=t, dur_us=MEASURED_US[k], category=k))
        t += MEASURED_US[k] + 1.0
    if host:
        spans.append(Span(name="aten::linear", track="cpu/1", start_us=0.0, dur_us=50.0, category="cpu_op"))
    if stage_annotation:
        spans.append(
            Span(name=stage_annotation, track="cpu/1", start_us=90.0, dur_us=t - 80.0, category="annotation",
                 args={"type": "annotation"})
        )  # fmt: skip
    return Timeline(source=TimelineSource(kind=TimelineKind.MEASURED, name="trace"), spans=tuple(spans))


def predicted(stage: Stage = Stage.PREFILL) -> Timeline:
    """The same model simulated: RoPE as ops of its own in each layer, and an ``isin`` outside layers."""
    layer = [*LAYER[:2], "rope", *LAYER[2:]]
    plan: list[tuple[str, int | None]] = [("embedding", None)]
    plan += [(k, 0) for k in layer] + [(k, 1) for k in layer]
    plan += [("norm", None), ("gemm", None), ("topk", None), ("other", None)]
    spans = []
    t = 0.0
    for op_id, (kind, layer_index) in enumerate(plan):
        dur = PREDICTED_US[kind]
        spans.append(
            Span(name=kind, track="engine0", start_us=t, dur_us=dur, op_id=op_id, kind=OpKind(kind),
                 layer=layer_index, stage=stage, step=0)
        )  # fmt: skip
        t += dur
    return Timeline(source=TimelineSource(kind=TimelineKind.SIMULATED, name="sim"), spans=tuple(spans))


def _sum(tl: Timeline) -> float:
    return sum(s.dur_us for s in tl.device_spans())


def test_every_microsecond_of_both_sides_is_in_each_table() -> None:
    pred, ref = predicted(), measured()
    c = compare_timelines(pred, ref)
    assert c.join is JoinMode.TRACE and c.level == "layer"
    pred_total = sum(PREDICTED_US[k] for k in ["embedding", "norm", "gemm", "topk", "other"])
    pred_total += 2 * (sum(PREDICTED_US[k] for k in LAYER) + PREDICTED_US["rope"])
    ref_total = sum(MEASURED_US[k] for k in ["embedding", "norm", "gemm", "sampling", "memcpy"])
    ref_total += 2 * sum(MEASURED_US[k] for k in LAYER)
    assert c.row("gpu_time").predicted_us == pytest.approx(pred_total)
    assert c.row("gpu_time").reference_us == pytest.approx(ref_total)
    for groups in (c.by_kind, c.by_layer, c.by_stage):
        assert sum(g.predicted_us for g in groups) == pytest.approx(pred_total)
        assert sum(g.reference_us for g in groups) == pytest.approx(ref_total)
    by_kind = {g.group: g for g in c.by_kind}
    # RoPE has no kernel typed rope in the trace (eager RoPE runs as elementwise kernels): a row of its own
    rope = by_kind["rope"]
    assert (rope.predicted_us, rope.reference_us, rope.ops) == (pytest.approx(3.0), 0.0, 0)
    assert rope.unmatched_predicted_us == pytest.approx(3.0) and math.isinf(rope.rel_error)
    assert by_kind["other"].predicted_us == pytest.approx(0.5)
    # the copy in layer 1 has no simulated op of its kind there
    assert by_kind["memory"].reference_us == pytest.approx(7.0) and by_kind["memory"].predicted_us == 0.0
    # unmatched: two rope groups (layers 0 and 1) and the isin group; one memory group
    assert (c.unmatched_predicted, c.unmatched_reference) == (3, 1)
    assert c.unmatched_predicted_us == pytest.approx(3.5) and c.unmatched_reference_us == pytest.approx(7.0)
    assert c.matched_share == pytest.approx((ref_total - 7.0) / ref_total)
    assert any("rope" in n and "elementwise" in n for n in c.notes)
    # saved and read back: the infinite error of a row with no reference time survives (saved as null)
    again = Comparison.model_validate_json(c.model_dump_json())
    assert again == c and math.isinf({g.group: g for g in again.by_kind}["rope"].rel_error)


def test_cli_prints_the_unmatched_time_and_its_column(tmp_path: Path) -> None:
    a = save_timeline(predicted(), tmp_path / "sim.json")
    b = save_timeline(measured(), tmp_path / "trace.json")
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 0, res.output
    assert "unmatched: 3 predicted (3.5 us), 1 reference (7.0 us)" in res.output
    assert "unmatched us (pred, ref)" in res.output
    rope = next(line for line in res.output.splitlines() if "│ rope" in line)
    assert "n/a" in rope


def test_op_id_join_rows_hold_the_unmatched_ops_too() -> None:
    # a measured timeline of the same graph (op ids on kernels) where op 1 was not measured and a copy
    # carries no op: both sides' rows still add up to their device time
    pred = predicted()
    ref_spans = [
        s.model_copy(update={"track": "gpu0/stream7", "dur_us": 2 * s.dur_us, "kind": None, "category": "kernel"})
        for s in pred.spans
        if s.op_id != 1
    ]
    ref_spans.append(Span(name="Memcpy", track="gpu0/stream7", start_us=500, dur_us=7, category="memcpy"))
    ref = Timeline(source=TimelineSource(kind=TimelineKind.MEASURED, name="m"), spans=tuple(ref_spans))
    c = compare_timelines(pred, ref)
    assert c.join is JoinMode.OP_ID
    for groups in (c.by_kind, c.by_layer, c.by_stage):
        assert sum(g.predicted_us for g in groups) == pytest.approx(_sum(pred))
        assert sum(g.reference_us for g in groups) == pytest.approx(_sum(ref))
    assert (c.unmatched_predicted, c.unmatched_reference) == (1, 1)
    assert c.unmatched_predicted_us == pytest.approx(PREDICTED_US["norm"]) and c.unmatched_reference_us == 7


def test_wall_time_is_one_extent_in_both_joins() -> None:
    # wall time: the timeline's wall_us when set, else first to last span with host spans: here the CPU op
    # at 0 us starts the trace, 100 us before its first kernel
    ref = measured()
    extent = max(s.end_us for s in ref.spans) - 0.0
    by_trace = compare_timelines(predicted(), ref)
    assert by_trace.join is JoinMode.TRACE
    assert by_trace.row("wall_time").reference_us == pytest.approx(extent)
    # the same trace against itself, by definition and order (a trace-vs-trace comparison)
    by_definition = compare_timelines(ref, ref, join=JoinMode.DEFINITION)
    assert by_definition.row("wall_time").reference_us == pytest.approx(extent)
    assert by_definition.row("wall_time").predicted_us == pytest.approx(extent)
    timed = ref.model_copy(update={"wall_us": 1234.0})
    assert compare_timelines(predicted(), timed).row("wall_time").reference_us == 1234.0


def test_a_decode_step_against_a_mixed_pass_says_so() -> None:
    c = compare_timelines(predicted(Stage.DECODE), measured(stage_annotation="step[MIXED bs=4]"))
    assert [(s.stage, s.pass_index) for s in c.by_step] == [("decode", 0)]
    assert any("decode step(s) [0]" in n and "mixed pass(es) [0]" in n for n in c.notes), c.notes


def test_a_rank_that_neither_side_has_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CompareError, match="no rank 5: both timelines are single-rank"):
        compare_timelines(predicted(), measured(), rank=5)
    assert compare_timelines(predicted(), measured(), rank=0).rank is None  # rank 0 is the only rank
    a = save_timeline(predicted(), tmp_path / "sim.json")
    b = save_timeline(measured(), tmp_path / "trace.json")
    res = CliRunner().invoke(app, ["compare", str(a), str(b), "--rank", "5"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "--rank: no rank 5" in res.stderr and "leave out --rank" in res.stderr


def test_op_id_join_compares_one_rank_never_all_summed() -> None:
    # a two-rank simulation against a two-rank measured run of the same graph: rank 1 ran twice as long
    pred, one = predicted(), predicted()
    ranks = [s.model_copy(update={"track": f"rank{r}/{s.track}"}) for r in (0, 1) for s in pred.spans]
    pred2 = pred.model_copy(update={"spans": tuple(ranks)})
    meas = [
        s.model_copy(update={"track": f"rank{r}/gpu0/stream7", "dur_us": (r + 1) * s.dur_us, "category": "kernel"})
        for r in (0, 1)
        for s in one.spans
    ]
    ref2 = Timeline(source=TimelineSource(kind=TimelineKind.MEASURED, name="m"), spans=tuple(meas))
    c = compare_timelines(pred2, ref2, rank=1)
    assert c.join is JoinMode.OP_ID and c.rank == 1
    assert c.row("gpu_time").reference_us == pytest.approx(2 * _sum(one))
    assert c.row("gpu_time rank0").reference_us == pytest.approx(_sum(one))
    assert c.ops[0].reference_us == pytest.approx(2 * c.ops[0].predicted_us)


def test_cpu_profile_is_compared_as_validate_does(tmp_path: Path) -> None:
    # `capture --device cpu --profile` records aten CPU ops attributed to graph ops, nested, no kernels
    pred = predicted()
    spans = []
    for s in pred.spans:
        outer = Span(name="aten::linear", track="cpu/1", start_us=10 * s.op_id, dur_us=4, op_id=s.op_id,
                     category="cpu_op")  # fmt: skip
        inner = outer.model_copy(update={"name": "aten::mm", "start_us": outer.start_us + 1, "dur_us": 2})
        spans += [outer, inner]
    cpu = Timeline(source=TimelineSource(kind=TimelineKind.MEASURED, name="cfg/config.json", device="cpu"),
                   spans=tuple(spans))  # fmt: skip
    a = save_timeline(pred, tmp_path / "sim.json")
    b = save_timeline(cpu, tmp_path / "g.timeline.json")
    out = tmp_path / "c.json"
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["compare", str(a), str(b), "--json", str(out)])
    assert res.exit_code == 0, res.output
    c = Comparison.model_validate_json(out.read_text())
    assert c.join is JoinMode.OP_ID and c.matched == len(pred.spans)
    # nested CPU ops count once: 4 us per op
    assert c.row("gpu_time").reference_us == pytest.approx(4.0 * len(pred.spans))
    assert any("CPU" in n for n in c.notes)
    # the library compares it the same way
    lib = compare_timelines(pred, cpu)
    assert lib.join is JoinMode.OP_ID and lib.row("gpu_time").reference_us == pytest.approx(4.0 * len(pred.spans))
    # a timeline with host spans only: one line naming the file passed, saying what to pass
    host = Timeline(source=TimelineSource(kind=TimelineKind.MEASURED, name="cfg/config.json"),
                    spans=(Span(name="aten::mm", track="cpu/1", start_us=0, dur_us=1, category="cpu_op"),))  # fmt: skip
    h = save_timeline(host, tmp_path / "host.timeline.json")
    res = CliRunner().invoke(app, ["compare", str(a), str(h)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert str(h) in res.stderr and "no device spans" in res.stderr and "pass a simulated timeline" in res.stderr
