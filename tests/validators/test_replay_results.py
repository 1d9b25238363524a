"""Result records: JSONL streaming, torn lines, resume keys, coverage, run-to-run spread, numerics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from replay_helpers import FAST

from opgraph.ir import DType, LoadError, OpgraphError
from tests.ir_builders import mm
from validators import (
    ReplayResult,
    ReplayStatus,
    ResultWriter,
    TimingConfig,
    TimingStats,
    config_key,
    coverage,
    load_results,
    replay_op,
    run_to_run,
)
from validators.numerics import compare
from validators.recipes import Compare
from validators.results import done_keys
from validators.timing import summarize


def _result(key: str, median: float, status: ReplayStatus = ReplayStatus.OK, share: float = 0.5) -> ReplayResult:
    timing = summarize([median, median * 1.01, median * 0.99]) if status is ReplayStatus.OK else None
    return ReplayResult(
        key=key, definition=f"def_{key}", kind="gemm", dtype="bf16", op=mm(0, 4, 8, 16), count=2, share=share,
        status=status, reason="" if status is ReplayStatus.OK else "why", device="cpu", timing=timing,
    )  # type: ignore[arg-type]  # fmt: skip


def test_round_trip_and_status_rules() -> None:
    r = replay_op(mm(0, 4, 8, 16), "cpu", FAST)
    again = ReplayResult.model_validate_json(r.model_dump_json())
    assert again == r
    assert again.op.definition == "gemm_n8_k16" and again.median_us == r.median_us
    with pytest.raises(ValidationError, match="needs timing"):
        ReplayResult(key="k", definition="d", kind="gemm", dtype="bf16", op=mm(0, 1, 1, 1), status="ok", device="cpu")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="needs a reason"):
        ReplayResult(
            key="k", definition="d", kind="gemm", dtype="bf16", op=mm(0, 1, 1, 1), status="error", device="cpu"
        )  # type: ignore[arg-type]


def test_stream_torn_line_and_newest_wins(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    with ResultWriter(out) as w:
        w.write(_result("a", 10.0))
        w.write(_result("b", 20.0))
    # A crash mid-write leaves half a line; reading skips it and the next writer starts a new line.
    with out.open("a") as f:
        f.write(_result("c", 30.0).model_dump_json()[:50])
    assert [r.key for r in load_results(out)] == ["a", "b"]
    with ResultWriter(out) as w:
        w.write(_result("a", 11.0))
    results = load_results(out)
    assert [r.key for r in results] == ["b", "a"]
    assert results[1].median_us == pytest.approx(11.0)
    assert done_keys([out, tmp_path / "missing.jsonl"]) == {"a", "b"}
    with pytest.raises(LoadError):
        load_results(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "a result"}\n' + _result("z", 1.0).model_dump_json() + "\n")
    assert [r.key for r in load_results(bad)] == ["z"]
    with pytest.raises(LoadError, match="line 1"):
        load_results(bad, strict=True)


def test_coverage_line() -> None:
    rs = [_result("a", 10.0, share=0.7), _result("b", 5.0, share=0.2),
          _result("c", 0.0, ReplayStatus.UNSUPPORTED, share=0.1)]  # fmt: skip
    cov = coverage(rs)
    assert (cov.configs, cov.replayed, cov.uses, cov.uses_replayed) == (3, 2, 6, 4)
    assert cov.share_replayed == pytest.approx(0.9)
    assert cov.measured_us == pytest.approx(2 * 10.0 + 2 * 5.0)
    line = cov.line()
    assert "2/3 configs replayed" in line and "90.00% of estimated op time" in line and "unsupported 1" in line
    assert coverage([]).line() == "coverage: 0/0 configs replayed; 0/0 op uses; replayed op time 0.000 ms"


def test_run_to_run_spread() -> None:
    a = [_result("a", 100.0), _result("b", 50.0), _result("c", 5.0)]
    b = [_result("a", 101.0), _result("b", 50.0), _result("c", 9.0)]
    rr = run_to_run(a, b, min_us=20.0)
    assert rr.configs == 2  # c is under 20 us
    assert rr.max_rel == pytest.approx(1 / 100.5)
    assert rr.over_2pct == 0 and rr.worst == "def_a"


def test_run_to_run_without_a_common_config_says_so() -> None:
    # Not "|Δmedian| median 0.00%": nothing was compared, which is no agreement at all.
    none = run_to_run([_result("a", 100.0)], [_result("b", 100.0)])
    assert none.configs == 0 and none.common == 0
    assert none.line() == "run-to-run: no config timed in both runs: nothing to compare with the baseline"
    short = run_to_run([_result("c", 5.0)], [_result("c", 9.0)], min_us=20.0)
    assert short.common == 1 and "none over 20 us" in short.line() and "0.00%" not in short.line()


def test_unsettled_timings_are_flagged_and_listed_in_replays_summary() -> None:
    from opgraph.cli.commands.replay import timing_line

    tight = summarize([20.0, 20.1, 19.9, 20.0, 20.05] * 4, converged=False)  # short of 0.5%, still settled
    assert tight.instability == ""
    # the QA case: a ~20 us op timed at ~6 ms, 9 samples spread 31%
    noisy = summarize([4200.0, 6035.0, 7900.0, 4600.0, 6035.0, 8100.0, 4300.0, 7000.0, 6035.0], converged=False)
    assert noisy.spread > 0.25
    assert noisy.instability.startswith("median ±")
    assert noisy.instability.endswith(f"after 9 samples, spread {noisy.spread:.0%}")
    many = summarize([10.0, 15.0, 20.0] * 300)  # a known median, but samples all over it
    assert many.instability == "spread 67%"
    results = [
        _result("a", 100.0).model_copy(update={"timing": tight}),
        _result("b", 100.0).model_copy(update={"timing": noisy}),
        _result("c", 100.0),
    ]
    line = timing_line(results, 0.005)
    assert line.startswith("timing: 2 of 3 timed configs did not reach --target-ci 0.50%; 1 unsettled")
    assert "def_b (median ±" in line and "def_a" not in line and "--keep-unconverged" in line
    assert timing_line(results[:1], 0.005).endswith("(none unsettled: each median is known within ±5%)")
    assert timing_line(results[2:], 0.005) == ""


def test_summarize_statistics() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median_us == 3.0 and s.min_us == 1.0 and s.samples == 5
    assert s.mad_us == 1.0 and s.iqr_us == 2.0 and s.spread == pytest.approx(2 / 3)
    assert isinstance(s, TimingStats)


def test_compare_tolerances_and_special_values() -> None:
    ref = torch.randn(64, dtype=torch.float64)
    ok = compare(ref.to(torch.bfloat16), ref, DType.bf16, Compare.ALL)
    assert ok.ok and ok.compared == 1 and ok.max_abs > 0
    bad = compare((ref * 1.1).to(torch.bfloat16), ref, DType.bf16, Compare.ALL)
    assert not bad.ok and "beyond tolerance" in bad.note
    assert not compare(ref.float(), ref * 1.001, DType.fp32, Compare.ALL).ok
    nan = ref.clone()
    nan[3] = float("nan")
    assert compare(nan, nan, DType.fp32, Compare.ALL).ok  # NaN where the reference has NaN
    assert not compare(nan, ref, DType.fp32, Compare.ALL).ok
    ints = torch.arange(5)
    assert not compare(ints, ints.flip(0), DType.fp32, Compare.ALL).ok
    assert compare((ref, ints), (ref, ints.flip(0)), DType.fp32, Compare.FLOAT_ONLY).ok
    assert not compare(ref[:3], ref, DType.fp32, Compare.ALL).ok


def test_ctrl_c_keeps_what_was_measured(tmp_path: Path) -> None:
    from replay_helpers import gemm_graph

    from validators.runner import run_replay

    out = tmp_path / "r.jsonl"

    def stop_after_two(r: ReplayResult, i: int, n: int) -> None:
        if i == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_replay([gemm_graph()], out=out, options=FAST, on_result=stop_after_two)
    assert len(load_results(out)) == 2
    run = run_replay([gemm_graph()], out=out, resume=True, options=FAST)
    assert (run.resumed, run.new, len(run.results)) == (2, 1, 3)


def test_a_misspelt_dtype_or_timer_is_a_validation_error() -> None:
    good = _result("a", 10.0)
    data = good.model_dump(mode="json")
    with pytest.raises(ValidationError, match="dtype"):
        ReplayResult.model_validate({**data, "dtype": "bfloat16"})
    assert ReplayResult.model_validate(data).dtype is DType.bf16
    with pytest.raises(ValidationError, match="timer"):
        ReplayResult.model_validate({**data, "timing": {**data["timing"], "timer": "cuda_event"}})
    with pytest.raises(OpgraphError, match="unknown timer 'event'"):
        TimingConfig(timer="event")  # type: ignore[arg-type]


H100_REPLAY = Path(__file__).parents[2] / "benchmarks/results/gpu/h100/llama8b_decode_b8_kv2048.replay.jsonl"


@pytest.mark.skipif(not H100_REPLAY.exists(), reason="the committed H100 replay results are not in this checkout")
def test_committed_replay_results_still_load_with_typed_fields() -> None:
    results = load_results(H100_REPLAY)
    assert results and all(isinstance(r.dtype, DType) for r in results)
    assert {r.timing.timer for r in results if r.timing is not None} == {"cuda_kernels"}
    # Config keys (resume, issue files) are what they were when the results were written.
    assert all(config_key(r.op) == r.key for r in results)
