"""The roofline model's invariants and every op kind costed (its accuracy against measured H100 times is in
``test_hardware_roofline_measured.py``)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware import Bound, RooflineModel, RooflineParams, UncostedOpError, load_hardware
from hardware.base import cost_graph
from opgraph.ir import (
    OP_TYPES,
    Activation,
    Attention,
    Collective,
    CollectiveKind,
    DType,
    Elementwise,
    Gemm,
    Memory,
    Norm,
    OpBase,
    OpGraph,
    OpKind,
    Other,
)

H100 = load_hardware("h100")
MODEL = RooflineModel()


def achieved(op: Gemm | Attention, seconds: float) -> float:
    return op.flops / (seconds * H100.peak_flops(op.dtype))


def test_small_elementwise_is_launch_bound_and_large_is_memory_bound() -> None:
    for numel in (1, 4096, 2**16, 2**19):
        assert MODEL.estimate(Elementwise(id=0, fn="add", numel=numel), H100).bound is Bound.LAUNCH, numel
    for numel in (2**21, 2**24, 2**28):
        assert MODEL.estimate(Elementwise(id=0, fn="add", numel=numel), H100).bound is Bound.MEMORY, numel
    tiny = MODEL.estimate(Elementwise(id=0, fn="add", numel=1), H100)
    assert tiny.seconds == pytest.approx(H100.launch_latency_us * 1e-6, rel=0.01)


def test_decode_gemm_is_memory_bound_near_weight_bandwidth() -> None:
    op = Gemm(id=0, m=1, n=4096, k=4096)
    cost = MODEL.estimate(op, H100)
    assert cost.bound is Bound.MEMORY
    weights_at_peak = 4096 * 4096 * 2 / H100.memory_bandwidth
    assert weights_at_peak < cost.seconds < 2 * weights_at_peak


def test_wave_quantization_fills_the_last_wave_for_free_then_steps() -> None:
    # 132 SMs, 128x256 tiles, n = 8192 gives 32 tile columns: 64 tile rows are 2048 tiles in 16
    # waves (the last one partial), 66 rows exactly fill 16 waves, one more row needs a 17th.
    def compute_s(rows: int) -> float:
        return MODEL.estimate(Gemm(id=0, m=rows, n=8192, k=4096), H100).compute_s

    assert compute_s(128 * 66) == pytest.approx(compute_s(128 * 64))
    assert compute_s(128 * 66 + 1) == pytest.approx(compute_s(128 * 66) * 17 / 16)


def test_causal_attention_costs_about_half_of_full_attention_not_a_quarter() -> None:
    kw = {"id": 0, "batch": 1, "q_len": 8192, "kv_len": 8192, "heads": 32, "kv_heads": 8, "head_dim": 128}
    causal, full = Attention(**kw, causal=True), Attention(**kw, causal=False)  # type: ignore[arg-type]
    assert causal.flops == pytest.approx(full.flops / 2, rel=0.01)
    ratio = MODEL.estimate(causal, H100).seconds / MODEL.estimate(full, H100).seconds
    assert 0.45 < ratio < 0.6


def test_short_attention_is_far_from_peak_and_long_attention_near_the_kernel_efficiency() -> None:
    kw = {"id": 0, "batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128, "causal": False}
    short = Attention(q_len=128, kv_len=128, **kw)  # type: ignore[arg-type]
    long = Attention(q_len=16384, kv_len=16384, **kw)  # type: ignore[arg-type]
    eff = RooflineParams().attention_efficiency
    assert achieved(short, MODEL.estimate(short, H100).seconds) < 0.2 * eff
    assert achieved(long, MODEL.estimate(long, H100).seconds) == pytest.approx(eff, rel=0.1)


def test_fp32_gemm_stays_off_tf32_unless_allowed() -> None:
    op = Gemm(id=0, m=4096, n=4096, k=4096, dtype=DType.fp32)
    plain = MODEL.estimate(op, H100).seconds
    tf32 = RooflineModel(allow_tf32=True).estimate(op, H100).seconds
    assert plain > 5 * tf32


def test_launch_latency_and_time_scale_options() -> None:
    op = Elementwise(id=0, fn="add", numel=16)
    assert RooflineModel(launch_latency_us=7).estimate(op, H100).us == pytest.approx(7, rel=0.01)
    scaled = RooflineModel(time_scale={"elementwise": 2.0}).estimate(op, H100)
    assert scaled.seconds == pytest.approx(2 * MODEL.estimate(op, H100).seconds)


EVERY_KIND: dict[OpKind, dict[str, Any]] = {
    OpKind.GEMM: {"m": 64, "n": 128, "k": 256},
    OpKind.ATTENTION: {"batch": 2, "q_len": 1, "kv_len": 512, "heads": 8, "kv_heads": 2, "head_dim": 64},
    OpKind.NORM: {"rows": 8, "hidden": 1024},
    OpKind.ROPE: {"tokens": 8, "heads": 8, "head_dim": 64},
    OpKind.EMBEDDING: {"tokens": 8, "vocab": 32000, "hidden": 1024},
    OpKind.ACTIVATION: {"fn": "silu", "numel": 8192, "hidden": 1024, "gated": True},
    OpKind.ELEMENTWISE: {"fn": "mul", "numel": 8192, "hidden": 1024},
    OpKind.REDUCTION: {"fn": "sum", "numel_in": 8192, "numel_out": 8, "reduced": 1024},
    OpKind.SOFTMAX: {"rows": 8, "cols": 32000},
    OpKind.TOPK: {"rows": 8, "cols": 32000, "k": 50},
    OpKind.MOE_ROUTING: {"tokens": 8, "experts": 64, "top_k": 8},
    OpKind.COLLECTIVE: {"collective": CollectiveKind.ALL_REDUCE, "bytes": 2**20, "group_size": 8},
    OpKind.MEMORY: {"fn": "kv_cache_write", "numel": 8192},
    OpKind.VIEW: {"fn": "reshape"},
    OpKind.OTHER: {"fn": "weird_op", "bytes_read": 4096, "bytes_written": 4096},
}
"""The fields of one op of each kind, in :class:`OpKind` order."""


def every_kind() -> list[OpBase]:
    """One op of every kind (ids 1, 2, ... in :class:`OpKind` order), built by the IR's kind-to-class table."""
    return [OP_TYPES[kind](id=i, **fields) for i, (kind, fields) in enumerate(EVERY_KIND.items(), start=1)]


@pytest.mark.parametrize("model_name", ["roofline", "formula"])
def test_every_op_kind_gets_a_cost_and_views_are_free(model_name: str) -> None:
    from hardware import resolve_cost_model

    graph = OpGraph(ops=tuple(every_kind()))  # type: ignore[arg-type]
    costs = cost_graph(graph, resolve_cost_model(model_name), H100, cache=False)
    assert costs.uncosted == {}
    assert set(costs.costs) == {op.id for op in graph.ops}
    assert costs.costs[14].seconds == 0 and costs.costs[14].bound is Bound.FREE
    assert costs.costs[12].bound in (Bound.LINK, Bound.LAUNCH) and "ranks" in costs.costs[12].detail
    for op_id, cost in costs.costs.items():
        if op_id != 14:
            assert cost.seconds > 0, op_id


def test_unrecognised_op_without_size_is_uncosted_with_a_reason() -> None:
    graph = OpGraph(ops=(Other(id=0, fn="mystery"), Gemm(id=1, m=8, n=8, k=8)))
    costs = cost_graph(graph, MODEL, H100)
    assert set(costs.uncosted) == {0} and "mystery" in costs.uncosted[0]
    assert costs.total_seconds == costs.costs[1].seconds
    off = cost_graph(OpGraph(ops=(Other(id=0, fn="x", bytes_read=8),)), RooflineModel(cost_other=False), H100)
    assert "off" in off.uncosted[0]


def test_collective_without_any_link_is_uncosted() -> None:
    hw = H100.model_copy(
        update={"interconnect": H100.interconnect.model_copy(update={"bandwidth": 0, "pcie_bandwidth": 0})}
    )
    op = Collective(id=0, collective=CollectiveKind.ALL_REDUCE, bytes=1024, group_size=2)
    with pytest.raises(UncostedOpError, match="no interconnect bandwidth"):
        MODEL.estimate(op, hw)


@pytest.mark.parametrize("name", ["h100", "a100", "gtx-1080-ti", "mi300x", "cpu", "b200", "l40s"])
def test_every_device_costs_a_layer(name: str) -> None:
    hw = load_hardware(name)
    graph = OpGraph(ops=tuple(every_kind()))  # type: ignore[arg-type]
    costs = cost_graph(graph, MODEL, hw)
    assert not costs.uncosted and all(math.isfinite(c.seconds) for c in costs.costs.values())


def test_faster_device_is_faster_on_big_gemms() -> None:
    op = Gemm(id=0, m=8192, n=8192, k=8192)
    times = [MODEL.estimate(op, load_hardware(n)).seconds for n in ("gtx-1080-ti", "a100", "h100", "b200")]
    assert times == sorted(times, reverse=True)


dims = st.integers(min_value=1, max_value=20000)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(0, 20000), n=dims, k=dims, dm=st.integers(0, 4096), dn=st.integers(0, 4096), dk=st.integers(0, 4096)
)
def test_gemm_time_is_monotone_in_every_dimension(m: int, n: int, k: int, dm: int, dn: int, dk: int) -> None:
    base = MODEL.estimate(Gemm(id=0, m=m, n=n, k=k), H100).seconds
    assert MODEL.estimate(Gemm(id=0, m=m + dm, n=n, k=k), H100).seconds >= base * (1 - 1e-12)
    assert MODEL.estimate(Gemm(id=0, m=m, n=n + dn, k=k), H100).seconds >= base * (1 - 1e-12)
    assert MODEL.estimate(Gemm(id=0, m=m, n=n, k=k + dk), H100).seconds >= base * (1 - 1e-12)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 64),
    q=st.integers(1, 4096),
    kv_extra=st.integers(0, 8192),
    more_kv=st.integers(0, 8192),
    more_batch=st.integers(0, 64),
    causal=st.booleans(),
)
def test_attention_time_is_monotone_in_kv_len_and_batch(
    batch: int, q: int, kv_extra: int, more_kv: int, more_batch: int, causal: bool
) -> None:
    kw = {"id": 0, "heads": 32, "kv_heads": 8, "head_dim": 128, "causal": causal, "q_len": q}
    base = MODEL.estimate(Attention(batch=batch, kv_len=q + kv_extra, **kw), H100).seconds  # type: ignore[arg-type]
    longer = MODEL.estimate(Attention(batch=batch, kv_len=q + kv_extra + more_kv, **kw), H100).seconds  # type: ignore[arg-type]
    wider = MODEL.estimate(Attention(batch=batch + more_batch, kv_len=q + kv_extra, **kw), H100).seconds  # type: ignore[arg-type]
    assert longer >= base * (1 - 1e-12) and wider >= base * (1 - 1e-12)


@settings(max_examples=40, deadline=None)
@given(numel=st.integers(0, 2**30), more=st.integers(0, 2**28), kind=st.sampled_from(["add", "copy", "norm", "act"]))
def test_pointwise_time_is_monotone_in_size(numel: int, more: int, kind: str) -> None:
    def make(n: int) -> object:
        if kind == "add":
            return Elementwise(id=0, fn="add", numel=n)
        if kind == "copy":
            return Memory(id=0, fn="copy", numel=n)
        if kind == "norm":
            return Norm(id=0, rows=n // 4096, hidden=4096)
        return Activation(id=0, fn="silu", numel=n, hidden=4096, gated=True)

    small, big = MODEL.estimate(make(numel), H100), MODEL.estimate(make(numel + more), H100)  # type: ignore[arg-type]
    assert big.seconds >= small.seconds * (1 - 1e-12)


def test_a_captured_graph_is_fully_costed() -> None:
    """Integration with capture: every op of a real (meta-device) capture gets a cost or a reason."""
    pytest.importorskip("torch")
    try:
        from opgraph.capture import capture
    except ImportError as exc:  # capture is optional for the hardware package
        pytest.skip(f"capture unavailable: {exc}")
    graph = capture("llama-3.2-1b", phase="prefill", seq_len=64, layers=1)
    costs = cost_graph(graph, MODEL, H100)
    assert len(costs.costs) + len(costs.uncosted) == len(graph.ops)
    assert all(reason for reason in costs.uncosted.values())
    gemm_ids = {op.id for op in graph.ops if op.kind.value == "gemm"}
    assert gemm_ids and gemm_ids <= set(costs.costs)
