"""The formula model keeps the seed simulator's numbers and scales to hypothetical hardware."""

from __future__ import annotations

import warnings

import pytest

from hardware import (
    Bound,
    CostModelError,
    FormulaModel,
    HardwareIgnoredWarning,
    cost_graph,
    cost_warnings,
    load_hardware,
)
from opgraph.ir import Elementwise, Gemm, Memory, Norm, OpGraph, Rope, View

H100 = load_hardware("h100")
pytestmark = pytest.mark.filterwarnings("ignore::hardware.HardwareIgnoredWarning")


def test_seed_formulas() -> None:
    model = FormulaModel()
    # MatMul: numel(A) x out_features x 0.5 us x 0.001
    assert model.estimate(Gemm(id=0, m=1, n=2048, k=2048), H100).us == pytest.approx(2048 * 2048 * 0.5 * 0.001)
    # residual add: numel x 0.5 x 0.25; RMSNorm: numel x 0.5 x 3 x 0.1; RoPE: numel / heads x 0.5 x 0.15
    assert model.estimate(Elementwise(id=0, fn="add", numel=2048), H100).us == pytest.approx(2048 * 0.125)
    assert model.estimate(Norm(id=0, rows=1, hidden=2048), H100).us == pytest.approx(2048 * 0.15)
    assert model.estimate(Rope(id=0, tokens=1, heads=32, head_dim=64), H100).us == pytest.approx(64 * 0.075)
    assert model.estimate(Memory(id=0, fn="kv_cache_write", numel=1000), H100).us == pytest.approx(1000 * 0.075)
    assert model.estimate(View(id=0), H100).bound is Bound.FREE


def test_truncation_floor_and_options() -> None:
    op = Elementwise(id=0, fn="add", numel=3)  # 0.375 us
    assert FormulaModel(truncate=True).estimate(op, H100).seconds == 0
    assert FormulaModel(truncate=True, min_us=1).estimate(op, H100).us == pytest.approx(1)
    assert FormulaModel(factors={"elementwise": 1.0}).estimate(op, H100).us == pytest.approx(1.5)
    with pytest.raises(CostModelError, match="unknown option 'speed'"):
        FormulaModel(speed=2)


def test_reference_device_scales_to_hypothetical_hardware() -> None:
    gemm, add = Gemm(id=0, m=64, n=64, k=64), Elementwise(id=0, fn="add", numel=4096)
    plain, scaled = FormulaModel(), FormulaModel(reference="h100")
    assert scaled.estimate(gemm, H100).seconds == pytest.approx(plain.estimate(gemm, H100).seconds)
    b200 = load_hardware("b200")
    assert scaled.estimate(gemm, b200).seconds < plain.estimate(gemm, b200).seconds
    ratio = scaled.estimate(add, b200).seconds / plain.estimate(add, b200).seconds
    assert ratio == pytest.approx(H100.memory_bandwidth / b200.memory_bandwidth)


def test_without_a_reference_it_warns_once_per_device_that_it_ignores_the_hardware() -> None:
    """Issue 16: ``-c formula -H h100`` predicted 20.6 hours for a 70B prefill without a word."""
    model, gemm = FormulaModel(), Gemm(id=0, m=8192, n=8192, k=8192)
    with pytest.warns(HardwareIgnoredWarning, match=r"ignores h100-sxm's peak FLOP/s and memory bandwidth"):
        model.estimate(gemm, H100)
    assert model.notes(H100) and "reference=DEVICE" in model.notes(H100)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.estimate(gemm, H100)  # once per device, not once per op
        FormulaModel(reference="h100").estimate(gemm, load_hardware("b200"))  # scales: nothing to say
    assert FormulaModel(reference="h100").notes(H100) == ()
    with pytest.warns(HardwareIgnoredWarning, match="b200"):
        model.estimate(gemm, load_hardware("b200"))


def test_cost_warnings_collects_the_lines_a_front_end_prints() -> None:
    graph = OpGraph(ops=(Gemm(id=0, m=64, n=64, k=64), Elementwise(id=1, fn="add", numel=64)))
    with cost_warnings() as notes:
        cost_graph(graph, FormulaModel(), H100)
        cost_graph(graph, FormulaModel(), H100)
    assert len(notes) == 1 and notes[0].startswith("the formula cost model ignores h100-sxm's")
    with cost_warnings() as notes:
        cost_graph(graph, FormulaModel(reference="h100"), H100)
    assert notes == []
