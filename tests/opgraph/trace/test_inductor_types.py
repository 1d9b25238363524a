"""Inductor (torch.compile) fused kernels typed by what they compute, not by the ops their outputs feed.

Inductor names a fused kernel after every op of the FX nodes it fuses, including the matmul or attention
op whose input it prepares: RoPE fused into the producer of an ``mm`` or of a
``_scaled_dot_product_cudnn_attention`` carries ``bmm`` and ``attention`` in its name. Only a template
kernel (``triton_tem_``) runs a matmul; a pointwise or reduction kernel never does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opgraph.ir.timeline import SpanCategory
from opgraph.trace import GpuEvent, KernelClassifier, default_patterns, load_trace_data
from opgraph.trace.patterns import KernelType, inductor_type, is_inductor_kernel

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"
TRACES = (Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces").resolve()

# From tests/data/traces/heldout/llama8b_compile_prefill256 (Llama 3.1 8B, torch.compile, H100).
ROPE_BMM = "triton_poi_fused__to_copy__unsafe_view_add_bmm_cat_cos_mul_neg_sin_slice_transpose_unsqueeze_view_2"
ROPE_SDPA = (
    "triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy__unsafe_view_add_arange_bmm_cat_clone_cos_"
    "expand_le_mul_neg_scalar_tensor_sin_slice_transpose_unsqueeze_view_where_3"
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (ROPE_BMM, KernelType.ROPE),
        (ROPE_SDPA, KernelType.ROPE),
        # the copy of RoPE's inv_freq, expanded for the angles' bmm (llama1b_static_cache_b1, heldout2)
        ("triton_poi_fused__to_copy_bmm_expand_unsqueeze_1", KernelType.MEMORY),
        ("triton_red_fused__to_copy_addmm_mean_mul_pow_rsqrt_4", KernelType.NORM),
        ("triton_poi_fused_addmm_silu_5", KernelType.ACTIVATION),
        ("triton_poi_fused_mm_mul_6", KernelType.ELEMENTWISE),
        # a template kernel runs the matmul itself
        ("triton_tem_fused_addmm_7", KernelType.GEMM),
        ("triton_tem_fused_bmm_cat_cos_8", KernelType.GEMM),
        # a fused softmax of attention scores (a decomposed math SDPA) is attention, as eager's is
        ("triton_per_fused__safe_softmax_scaled_dot_product_attention_exp_9", KernelType.ATTENTION),
    ],
)
def test_fused_kernels_typed_by_what_they_compute(name: str, expected: KernelType) -> None:
    assert inductor_type(name) is expected


def _event(name: str) -> GpuEvent:
    ev = GpuEvent(name, SpanCategory.KERNEL, 0.0, 1.0, 0, 7)
    # with the profiler on, inductor opens a host range named after each kernel around its launch
    ev.launch_stack = (name, "Torch-Compiled Region: 0/0")
    ev.launch_op = name
    return ev


@pytest.mark.parametrize("name", [ROPE_BMM, ROPE_SDPA])
def test_the_range_named_after_the_kernel_is_no_launching_op(name: str) -> None:
    # "scaled_dot_product" in the kernel's own range matched the attention [[launch]] rule
    ev = _event(name)
    KernelClassifier(default_patterns()).classify([ev])
    assert ev.ktype is KernelType.ROPE


def test_inductor_kernel_names() -> None:
    assert is_inductor_kernel(ROPE_SDPA) and is_inductor_kernel("triton_tem_fused_mm_0")
    assert not is_inductor_kernel("aten::_scaled_dot_product_cudnn_attention")
    assert not is_inductor_kernel("triton_red_fused")  # no op list: not inductor's naming


def _types(path: Path) -> dict[str, tuple[KernelType, int, float]]:
    (data,) = load_trace_data(path)
    KernelClassifier(default_patterns()).classify(data.gpu, data.host)
    out: dict[str, tuple[KernelType, int, float]] = {}
    for g in data.gpu:
        _, n, t = out.get(g.name, (g.ktype, 0, 0.0))
        out[g.name] = (g.ktype, n + 1, t + g.dur)
    return out


def test_llama8b_compile_rope_kernels_are_rope() -> None:
    types = _types(DATA / "heldout" / "llama8b_compile_prefill256.json.gz")
    kt, count, time_us = types[ROPE_BMM]
    assert (kt, count, round(time_us, 2)) == (KernelType.ROPE, 2, 8.26)
    sdpa = [v for k, v in types.items() if k.startswith("triton_poi_fused__scaled_dot_product_cudnn_attention")]
    assert {kt for kt, _, _ in sdpa} == {KernelType.ROPE}
    assert sum(n for _, n, _ in sdpa) == 8
    # the attention itself is cuDNN's kernel, which keeps its type
    assert any(kt is KernelType.ATTENTION and not k.startswith("triton_") for k, (kt, _, _) in types.items())


def _all_traces() -> list[Path]:
    paths = sorted(DATA.glob("heldout*/*.json.gz"))
    if TRACES.is_dir():
        paths += sorted(p for p in TRACES.glob("*.json.gz"))
    return paths


@pytest.mark.parametrize("path", _all_traces(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_pointwise_or_reduction_kernel_is_a_gemm_or_attention(path: Path) -> None:
    for name, (kt, _, _) in _types(path).items():
        if name.startswith(("triton_poi_", "triton_red_", "triton_per_")) and "softmax" not in name:
            assert kt not in (KernelType.GEMM, KernelType.ATTENTION), name
