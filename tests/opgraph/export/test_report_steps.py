"""Reports a user can trust on multi-step and multi-rank traces (issue 19, item 4)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.export import stats
from opgraph.ir import Span, Timeline, TimelineKind
from opgraph.trace import analyze, load_trace

TRACES = (Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces").resolve()
LLAMA = TRACES / "hf-llama-1b-like-h200-prefill512-decode8.json.gz"


@cache
def _measured() -> Timeline:
    if not LLAMA.exists():
        pytest.skip(f"real trace {LLAMA.name} not found in {TRACES}")
    return load_trace(LLAMA)


def test_layer_rows_of_a_multi_step_trace_are_model_layers_per_stage() -> None:
    tl = _measured()
    dev = stats.device_spans(tl)
    rows = stats.time_by_layer(dev)
    keys = [r.key for r in rows]
    # 8 passes x 16 layers: 16 prefill rows and 16 decode rows (summed over the 7 decode passes), not L0..L127
    assert keys == [f"prefill L{i}" for i in range(16)] + [f"decode L{i}" for i in range(16)] + ["other"]
    assert sum(r.total_us for r in rows) == pytest.approx(sum(s.dur_us for s in dev))
    decode_l0 = sum(
        x.time_us for x in analyze(LLAMA).layers if x.stage == "decode" and x.layer == 0
    )  # kernels only; the layer rows count memsets too
    assert dict((r.key, r.total_us) for r in rows)["decode L0"] >= decode_l0 - 1e-6


def test_step_and_stage_rows() -> None:
    tl = _measured()
    s = stats.summarize(tl)
    r = analyze(LLAMA)
    steps = [row for row in s.by_step if row.key.startswith("step")]
    assert [row.key for row in steps] == ["step 0 (prefill)"] + [f"step {i} (decode)" for i in range(1, 8)]
    for row, p in zip(steps, r.passes, strict=True):
        assert row.total_us >= p.time_us - 1e-6  # the pass's kernels, plus its memsets and copies
    stages = {row.key: row.total_us for row in s.by_stage}
    assert stages["decode"] > stages["prefill"] > 0


def test_single_step_timelines_keep_plain_layer_rows() -> None:
    spans = [
        Span(name="k", track="gpu0/s", start_us=i, dur_us=1.0, layer=i % 2, step=0, op_id=i, category="gemm")
        for i in range(4)
    ]
    tl = Timeline.model_validate({"source": {"kind": TimelineKind.SIMULATED, "name": "x"}, "spans": spans})
    assert [r.key for r in stats.time_by_layer(tl.spans)] == ["L0", "L1"]
    assert stats.time_by_step(tl.spans) == ()


def test_analyze_prints_a_prefill_decode_breakdown() -> None:
    _measured()
    out = CliRunner().invoke(app, ["analyze", str(LLAMA)]).output
    table = out[out.index("by stage (prefill/decode breakdown)") :]
    line = next(x for x in table.splitlines() if x.strip("│ ").startswith("decode"))
    assert [c.strip() for c in line.split("│")[2:4]] == ["7", "112"]  # 7 decode passes, 112 layers


def _ranks(tl: Timeline, n: int) -> Timeline:
    spans = tuple(s.model_copy(update={"track": f"rank{r}/{s.track}"}) for r in range(n) for s in tl.spans)
    return tl.model_copy(update={"spans": spans})


def test_report_compares_one_simulated_rank_with_a_one_rank_trace() -> None:
    measured = _measured()
    r = analyze(LLAMA)
    # a "simulation" that is the measured device work with op ids, on 4 ranks
    sim_spans = [
        s.model_copy(update={"op_id": i, "category": None, "track": "compute0"})
        for i, s in enumerate(stats.device_spans(measured))
    ]
    sim = Timeline.model_validate({"source": {"kind": TimelineKind.SIMULATED, "name": "sim"}, "spans": sim_spans})
    tables = stats.comparison_tables(measured, _ranks(sim, 4))
    end = tables[0]
    gpu = next(row for row in end.rows if row[0] == "gpu_time")
    one_rank = sum(s.dur_us for s in sim_spans)
    assert float(str(gpu[1]).replace(",", "")) == pytest.approx(one_rank, rel=1e-3)  # not 4x
    assert float(str(gpu[2]).replace(",", "")) == pytest.approx(r.kernel_time_us + r.memcpy_time_us, rel=1e-3)
    assert any(t.title.startswith("By step") for t in tables)


def test_compare_cli_details_and_draws_the_rank_asked_for(tmp_path: Path) -> None:
    from opgraph.compare import Comparison
    from opgraph.ir import load_model, save_timeline

    measured = _measured()
    sim_spans = [
        s.model_copy(update={"op_id": i, "category": None, "track": "compute0", "dur_us": s.dur_us * 2})
        for i, s in enumerate(stats.device_spans(measured))
    ]
    sim = Timeline.model_validate({"source": {"kind": TimelineKind.SIMULATED, "name": "sim"}, "spans": sim_spans})
    sim_path = save_timeline(_ranks(sim, 2), tmp_path / "sim.json")
    out = tmp_path / "c.json"
    res = CliRunner().invoke(
        app,
        ["compare", str(sim_path), str(LLAMA), "--rank", "1", "--json", str(out), "--html", str(tmp_path / "r.html")],
    )
    assert res.exit_code == 0, res.output
    c = load_model(out, Comparison)
    assert c.rank == 1 and c.row("gpu_time").rel_error == pytest.approx(1.0, rel=1e-3)  # one rank at 2x, not 4x
    assert any("rank 1 of the 2-rank simulation" in n for n in c.notes)
    assert (tmp_path / "r.html").stat().st_size > 0
