"""The generate validation's CPU side (benchmarks/generate_validate_report.py): step times from a
simulated timeline, their comparison with measured ones, and the profiled forwards of a trace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.generate_validate_report import (
    StepComparison,
    capture_args,
    compare_steps,
    quiet_rounds,
    restrict,
    simulate_case,
    simulated_steps,
    traced_forwards,
    union_length,
)


@dataclass
class FakeSpan:
    step: int | None
    end_us: float


def test_simulated_steps_add_up_to_the_last_end_and_follow_each_step_end() -> None:
    spans = [FakeSpan(0, 5.0), FakeSpan(0, 9.0), FakeSpan(None, 50.0), FakeSpan(1, 12.0), FakeSpan(2, 20.0)]
    assert simulated_steps(spans) == [9.0, 3.0, 8.0]


def test_simulated_steps_refuse_a_timeline_with_a_missing_step() -> None:
    with pytest.raises(ValueError, match=r"not 0\.\.n"):
        simulated_steps([FakeSpan(0, 1.0), FakeSpan(2, 3.0)])


def test_step_comparison_errors_median_and_worst() -> None:
    cmp = StepComparison((100.0, 10.0, 10.0, 20.0), (90.0, 11.0, 9.0, 30.0))
    assert cmp.errors == pytest.approx((-0.1, 0.1, -0.1, 0.5))
    assert cmp.prefill_error == pytest.approx(-0.1)
    assert cmp.median_decode_error == pytest.approx(0.1)
    step, worst = cmp.worst
    assert step == 3
    assert worst == pytest.approx(0.5)
    assert cmp.sum_error == pytest.approx((140 - 140) / 140)


def test_step_comparison_refuses_different_step_counts() -> None:
    with pytest.raises(ValueError, match="3 measured steps but 2 simulated"):
        StepComparison((1.0, 2.0, 3.0), (1.0, 2.0))


def test_data_without_the_return_clock_leave_the_last_step_out() -> None:
    old = {"step_wall_us": [10.0, 5.0, 2.0]}
    assert compare_steps(old, [9.0, 5.0, 6.0]).measured_us == (10.0, 5.0)
    new = {**old, "setup_us": 1.0}
    assert compare_steps(new, [9.0, 5.0, 6.0]).measured_us == (10.0, 5.0, 2.0)


def test_quiet_rounds_need_both_probes_near_their_fastest() -> None:
    probes = [
        {"round": 0, "launch_us": 6.0, "python_loop_ns": 40.0},
        {"round": 1, "launch_us": 6.5, "python_loop_ns": 33.0},
        {"round": 2, "launch_us": 9.0, "python_loop_ns": 34.0},  # launches slow
        {"round": 3, "launch_us": 6.2, "python_loop_ns": 35.0},
    ]
    assert quiet_rounds(probes, within=1.1) == [1, 3]


def test_restrict_keeps_the_rounds_walls_and_per_step_medians() -> None:
    hooked = [
        {"setup_us": 1.0, "step_wall_us": [10.0, 5.0]},
        {"setup_us": 9.0, "step_wall_us": [90.0, 50.0]},
        {"setup_us": 3.0, "step_wall_us": [30.0, 7.0]},
        {"setup_us": 2.0, "step_wall_us": [20.0, 6.0]},
    ]
    case = {"case": "c", "wall_us": {"median": 0.0, "runs": [100.0, 900.0, 300.0, 200.0]}, "hooked_runs": hooked}
    kept = restrict(case, [0, 2, 3])
    assert kept["wall_us"] == {"median": 200.0, "min": 100.0, "runs": [100.0, 300.0, 200.0]}
    assert kept["step_wall_us"] == [20.0, 6.0]
    assert kept["setup_us"] == 2.0


def test_union_length_counts_overlaps_once() -> None:
    assert union_length([(0.0, 4.0), (2.0, 6.0), (10.0, 11.0), (3.0, 5.0)]) == pytest.approx(7.0)


def test_traced_forwards_attribute_gpu_work_and_syncs_to_the_forward_that_launched_them() -> None:
    def ev(cat: str, name: str, ts: float, dur: float, corr: int | None = None) -> dict[str, object]:
        e: dict[str, object] = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
        if corr is not None:
            e["args"] = {"correlation": corr}
        return e

    trace = {
        "traceEvents": [
            ev("user_annotation", "opgraph_forward_1", 100, 50),
            ev("user_annotation", "opgraph_forward_0", 0, 60),
            ev("cuda_runtime", "cudaLaunchKernel", 10, 2, 1),
            ev("cuda_driver", "cuLaunchKernelEx", 20, 2, 2),  # cuBLAS launches through the driver API
            ev("cuda_runtime", "cudaStreamSynchronize", 30, 20),
            ev("cuda_runtime", "cudaLaunchKernel", 110, 2, 3),
            ev("kernel", "k1", 15, 10, 1),
            ev("kernel", "k2", 20, 10, 2),  # overlaps k1: 15..30 busy
            ev("gpu_memcpy", "copy", 70, 5, 2),  # launched in forward 0, runs after it
            ev("kernel", "k3", 200, 7, 3),
        ]
    }
    f0, f1 = traced_forwards(trace)
    assert (f0.host_us, f0.gpu_busy_us, f0.kernels, f0.syncs) == (60.0, 20.0, 2, 1)
    assert (f1.host_us, f1.gpu_busy_us, f1.kernels, f1.syncs) == (50.0, 7.0, 1, 0)


def test_a_case_with_overrides_is_captured_from_its_own_config(tmp_path: Path) -> None:
    case = {"case": "c", "preset": "llama-3.2-1b", "layers": 2, "batch": 4, "prompt": 16, "new_tokens": 5}
    plain = capture_args(case, tmp_path)
    assert plain[:3] == ["llama-3.2-1b", "--layers", "2"]
    assert plain[plain.index("--new-tokens") + 1] == "4"  # N new tokens: a prefill and N-1 decode steps
    custom = capture_args({**case, "overrides": {"hidden_size": 64}, "config": {"model_type": "llama"}}, tmp_path)
    assert Path(custom[0]).read_text() == '{"model_type": "llama"}'


@pytest.mark.slow
def test_simulated_steps_of_a_planned_generation_add_up_to_its_makespan(tmp_path: Path) -> None:
    case = {"case": "t", "preset": "llama-3.2-1b", "layers": 1, "batch": 1, "prompt": 16, "new_tokens": 8}
    makespan, steps = simulate_case(case, tmp_path)
    assert len(steps) == 8
    assert sum(steps) == pytest.approx(makespan, rel=1e-9)
    assert steps[0] > steps[1] > 0  # the prefill of 16 tokens costs more than a decode step
