"""Kernel classification rules that must hold on traces the rules were not written against."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opgraph.ir.timeline import SpanCategory
from opgraph.trace import KernelType, PatternError, analyze, load_patterns, load_trace_data
from opgraph.trace.analysis import find_steps
from opgraph.trace.events import HostEvent
from opgraph.trace.patterns import core_name, inductor_type

PS = load_patterns(user_dirs=False)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # argument types say nothing about what a kernel computes
        (
            "void flashinfer::quantize_with_block_size<(flashinfer::QuantizationSFLayout)0, 16, false>"
            "(int, int, __nv_bfloat16 const*, float const*, unsigned int*, flashinfer::QuantizationSFLayout)",
            KernelType.QUANTIZATION,
        ),
        (
            "void tensorrt_llm::kernels::cvt_fp16_to_fp4<__nv_bfloat16, false>(int, int, __nv_bfloat16 const*, "
            "float const*, unsigned int*, unsigned int*, flashinfer::QuantizationSFLayout, at::attention_mask)",
            KernelType.QUANTIZATION,
        ),
        # GEMM-family names before activation substrings; routed-expert batched GEMMs are MoE
        ("ampere_fp16_s16816gemm_relu_fp16_256x128_ldg8_f2f_stages_64x3_tn", KernelType.GEMM),
        ("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize96x128x32_stage4_gemm_relu_kernel", KernelType.GEMM),
        ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x128x64_MI16x16x1_SN_LDSB1_AFC1_gelu", KernelType.GEMM),
        (
            "bmm_Bfloat16_E2m1E2m1_Fp32_t128x8x512u2_s3_et128x8_m128x8x64_cga1x1x1_16dp256b_rM_TN_transOut"
            "_schedS_bN_swiGlu_dynBatch_sm100f",
            KernelType.MOE,
        ),
        ("bmm_Bfloat16_Bfloat16_Fp32_t128x8x64_s3_TN_transOut_sm100f", KernelType.GEMM),
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", KernelType.GEMM),
        # inductor fused kernels by what they compute, not by their first op
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", KernelType.NORM),
        ("triton_poi_fused_mul_silu_3", KernelType.ACTIVATION),
        ("triton_poi_fused_constant_pad_nd_moe_forward_0", KernelType.MOE),
        ("triton_poi_fused__to_copy_cat_clone_2", KernelType.MEMORY),
        ("triton_tem_fused_addmm_7", KernelType.GEMM),
        # a library namespace is no kernel type: flashinfer's norm is a norm
        (
            "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, unsigned int)",
            KernelType.NORM,
        ),
        ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<true, 2u>(flashinfer::Params)", KernelType.ATTENTION),
        # nor is FBGEMM's (the param DLRM trace): its permutes are data movement, not GEMMs
        ("void fbgemm_gpu::permute_2D_data_kernel<true, int, float>(int, int, int const*, float*)", KernelType.MEMORY),
    ],
)
def test_kernel_types_from_names(name: str, expected: KernelType) -> None:
    assert PS.kernel_type(name)[0] is expected


def test_core_name_drops_the_argument_list_and_keeps_templates() -> None:
    name = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>(float*, float const*, int)"
    assert core_name(name) == "at::native::cunn_SoftMaxForward<8, float>"
    assert core_name("triton_poi_fused_add_0") == "triton_poi_fused_add_0"
    assert inductor_type("flash_fwd_kernel") is None


def _host(name: str, kind: SpanCategory, ts: float, dur: float) -> HostEvent:
    return HostEvent(name, kind, ts, dur, 0, 0)


@pytest.mark.parametrize(
    ("annotation", "stage", "tokens"),
    [
        ("execute_context_1(888_788544)_generation_0(0)", "prefill", 888),
        ("execute_context_0(0_0)_generation_16(16)", "decode", 16),
        ("execute_context_2(40_900)_generation_5(5)", "mixed", 45),
        ("execute_8192_context_9(sq8155sk8430sqsq7475785)_generation_37(sq37sk34489sqsq37)", "mixed", 8192),
        ("step[EXTEND bs=15 toks=15360]", "prefill", None),
    ],
)
def test_step_annotation_forms(annotation: str, stage: str, tokens: int | None) -> None:
    (step,) = find_steps([_host(annotation, SpanCategory.ANNOTATION, 0.0, 10.0)], PS)
    assert (step.stage, step.tokens) == (stage, tokens)


# --- synthetic traces: launch-op evidence, stage weighing, empty analyses


def _ev(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    tid = 7 if cat == "kernel" else 1
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": args}


class _Builder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.t = 1000.0
        self.corr = 1

    def kernel(
        self,
        name: str,
        ops: tuple[str, ...] = (),
        dur: float = 3.0,
        dims: list[Any] | None = None,
        launch: str = "cudaLaunchKernel",
        kernels: int = 1,
    ) -> None:
        """``kernels`` kernels launched (by ``launch``) inside ``ops`` (outermost first; the innermost takes
        ``dims``): one call, as ATen splits an op over a tensor past 2^31 bytes."""
        c = self.corr
        t = self.t
        span = kernels * max(10.0, dur + 5)
        for depth, op in enumerate(ops):
            args: dict[str, Any] = {"External id": c}
            if dims is not None and depth == len(ops) - 1:
                args["Input Dims"] = dims
            self.events.append(_ev("cpu_op", op, t + depth * 0.1, span - 5 - depth * 0.2, **args))
        for i in range(kernels):
            corr, at = c + i, t + i * max(10.0, dur + 5)
            self.events.append(_ev("cuda_runtime", launch, at + 1, 1, correlation=corr, **{"External id": c}))
            self.events.append(_ev("kernel", name, at + 3, dur, correlation=corr, device=0, stream=7))
        self.corr += kernels
        self.t += span

    def write(self, tmp: Path) -> Path:
        p = tmp / "t.json"
        p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": self.events}))
        return p


GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_kernel"


def _layer(b: _Builder, attention: str, *, moe_op: bool = False, attn_dur: float = 3.0) -> None:
    b.kernel("void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*)", ("_C::rms_norm",))
    b.kernel(GEMM, ("aten::linear", "aten::mm"))
    b.kernel(attention, ("vllm::unified_attention",), dur=attn_dur)
    b.kernel(GEMM, ("aten::linear", "aten::mm"))
    b.kernel("void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*)", ("_C::rms_norm",))
    if moe_op:
        b.kernel(GEMM, ("vllm::moe_forward", "aten::mm"))
        b.kernel("void vllm::act_and_mul_kernel<c10::BFloat16>(c10::BFloat16*)", ("vllm::moe_forward", "_C::silu"))
        b.kernel(GEMM, ("vllm::moe_forward", "aten::mm"))
    else:
        b.kernel(GEMM, ("aten::linear", "aten::mm"))
        b.kernel("void vllm::act_and_mul_kernel<c10::BFloat16>(c10::BFloat16*)", ("_C::silu_and_mul",))
        b.kernel(GEMM, ("aten::linear", "aten::mm"))


def test_launching_op_is_evidence_outermost_first(tmp_path: Path) -> None:
    b = _Builder()
    for _ in range(2):
        _layer(b, "kernel_paged_attention_2d", moe_op=True)
    data = load_trace_data(b.write(tmp_path))[0]
    assert data.gpu[5].launch_stack == ("aten::mm", "vllm::moe_forward")
    r = analyze(tmp_path / "t.json")
    types = {b.name: b.count for b in r.by_type}
    # expert GEMMs launched by aten::mm inside vllm::moe_forward are MoE, so every layer is an MoE layer
    assert types["moe"] == 6 and types["gemm"] == 4
    assert {x.kind for x in r.layers} == {"MHA_MOE"}


def test_prefill_kernels_outweigh_decode_votes_and_timing_outliers_are_prefill(tmp_path: Path) -> None:
    b = _Builder()
    # step 1: a prefill kernel and a paged-attention (decode-voting) kernel in every layer, no sampling between
    for _ in range(2):
        _layer(b, "context_attention_fwd_kernel")
        b.kernel("kernel_paged_attention_2d", ("vllm::unified_attention",))
    b.kernel("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ArgMaxOps<float>>>", ("aten::argmax",))
    # then decode steps, and one step that takes far longer than the others with only decode votes
    for step in range(4):
        for _ in range(2):
            _layer(b, "kernel_paged_attention_2d", attn_dur=400.0 if step == 2 else 3.0)
        b.kernel(
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ArgMaxOps<float>>>", ("aten::argmax",)
        )
    r = analyze(b.write(tmp_path))
    assert [p.stage for p in r.passes] == ["prefill", "decode", "decode", "prefill", "decode"]
    assert [p.stage_source for p in r.passes] == ["vote", "vote", "vote", "timing", "vote"]
    assert any("median pass read as prefill" in n for n in r.notes)


def test_no_layers_gives_zero_passes_without_claiming_one_was_assumed(tmp_path: Path) -> None:
    b = _Builder()
    for _ in range(5):
        b.kernel(GEMM, ("aten::mm",))
        b.kernel(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", ("aten::add",)
        )
    r = analyze(b.write(tmp_path))
    assert r.passes == () and r.layers == ()
    assert not any("assumed" in n for n in r.notes)
    assert any("0 passes" in n for n in r.notes)


def test_window_leftovers_only_at_the_start(tmp_path: Path) -> None:
    b = _Builder()
    # two kernels with no launch in the trace, then a normal layer, then an unlinked kernel later on
    for i, name in enumerate((GEMM, GEMM)):
        b.events.append(_ev("kernel", name, 100.0 + 10 * i, 5.0, device=0, stream=7))
    _layer(b, "flash_fwd_kernel")
    b.events.append(_ev("kernel", GEMM, b.t + 50, 5.0, device=0, stream=7))
    r = analyze(b.write(tmp_path))
    assert r.window_events == 2 and r.window_time_us == 10.0
    assert r.layers_per_pass == (1,)


def test_window_leftovers_are_left_out_of_the_totals_and_tables(tmp_path: Path) -> None:
    # The earlier step's tail is not this trace's work: the headline and tables count the rest, as
    # compare and attribute_kernels do (the TraceLens H100 Qwen1.5 trace: 509 such events).
    b = _Builder()
    for i in range(2):
        b.events.append(_ev("kernel", GEMM, 100.0 + 10 * i, 5.0, device=0, stream=7))
    b.events.append(_ev("gpu_memset", "Memset (Device)", 120.0, 1.0, device=0, stream=7))
    _layer(b, "flash_fwd_kernel")
    own = [e for e in b.events if e["cat"] in ("kernel", "gpu_memset") and e["ts"] > 500]
    own_kernels = [e for e in own if e["cat"] == "kernel"]
    r = analyze(b.write(tmp_path))
    assert r.window_events == 3 and r.window_time_us == 11.0
    assert r.kernels == len(own_kernels) == 8 and r.memcpy == 0
    assert r.kernel_time_us == pytest.approx(sum(e["dur"] for e in own_kernels))
    # the kernels are back to back at most: the span runs from the layer's first kernel to its last one
    assert r.makespan_us == pytest.approx(max(e["ts"] + e["dur"] for e in own) - min(e["ts"] for e in own))
    assert r.gpu_busy_us == pytest.approx(r.kernel_time_us)
    assert sum(x.count for x in r.by_type) == sum(x.count for x in r.by_stage) == r.kernels
    assert {x.name for x in r.by_stage} == {"unknown"} and r.passes[0].kernels == r.kernels
    assert sum(u.count for u in r.unique_kernels) == r.kernels
    (note,) = [n for n in r.notes if "before the profiler window" in n]
    assert "3 device events (2 kernels, 0.011 ms)" in note and "left out of every total and table" in note


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("aten::cumsum", KernelType.REDUCTION),
        ("aten::index_put_", KernelType.MEMORY),
        ("aten::_to_copy", KernelType.MEMORY),
        ("aten::argmax", KernelType.SAMPLING),
        ("aten::hardtanh", KernelType.ELEMENTWISE),
        ("myext::mystery", KernelType.UNKNOWN),
    ],
)
def test_unknown_kernels_take_a_type_from_their_aten_op(tmp_path: Path, op: str, expected: KernelType) -> None:
    b = _Builder()
    b.kernel("void some_vendor::opaque_kernel_v2<7>(float*)", (op,))
    data = load_trace_data(b.write(tmp_path))[0]
    from opgraph.trace import KernelClassifier

    KernelClassifier(PS).classify(data.gpu)
    assert data.gpu[0].ktype is expected


_SCALE = ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float>>", "aten::mul")
_REDUCE = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MaxOps<float>>>(float*)"
# gpt-oss's eager attention with sinks: scale, mask, concatenate the sink logits, row max, subtract, softmax
_SINK_STEPS = (
    _SCALE,
    ("void at::native::elementwise_kernel<128, 4, at::native::AddFunctor<float>>(int)", "aten::add"),
    ("void at::native::CatArrayBatchedCopy<float>(float*)", "aten::cat"),
    (_REDUCE, "aten::max"),
    ("void at::native::elementwise_kernel<128, 4, at::native::SubFunctor<float>>(int)", "aten::sub"),
)


def _eager_layer(b: _Builder, q: int, k: int, between: tuple[tuple[str, str], ...] = (_SCALE,)) -> None:
    b.kernel("void at::native::vectorized_layer_norm_kernel<float>(int, float*)", ("aten::native_layer_norm",))
    b.kernel(GEMM, ("aten::linear", "aten::addmm"))
    b.kernel(
        "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_64x1_nn_align8",
        ("aten::matmul", "aten::bmm"),
        dims=[[32, q, 64], [32, 64, k]],
    )
    for name, op in between:
        b.kernel(name, (op,))
    b.kernel("void (anonymous namespace)::softmax_warp_forward<float>(float*)", ("aten::softmax", "aten::_softmax"))
    b.kernel(
        "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_64x1_nn_align8",
        ("aten::matmul", "aten::bmm"),
        dims=[[32, q, k], [32, k, 64]],
    )
    b.kernel(GEMM, ("aten::linear", "aten::addmm"))
    b.kernel("void at::native::vectorized_layer_norm_kernel<float>(int, float*)", ("aten::native_layer_norm",))
    b.kernel(GEMM, ("aten::linear", "aten::addmm"))
    b.kernel("void at::native::GeluCUDAKernelImpl<float>(float*)", ("aten::gelu",))
    b.kernel(GEMM, ("aten::linear", "aten::addmm"))


def test_eager_attention_layers_and_their_stage_from_bmm_shapes(tmp_path: Path) -> None:
    b = _Builder()
    for q, k in ((128, 128), (1, 129)):
        for _ in range(3):
            _eager_layer(b, q, k)
        b.kernel(
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ArgMaxOps<float>>>", ("aten::argmax",)
        )
    r = analyze(b.write(tmp_path))
    assert r.layers_per_pass == (3, 3)
    assert [(p.stage, p.stage_source) for p in r.passes] == [("prefill", "shape"), ("decode", "shape")]
    assert {b.name: b.count for b in r.by_type}["attention"] == 6 * 4  # bmm, scale, softmax, bmm


def test_eager_attention_with_sinks_is_attention(tmp_path: Path) -> None:
    # issue 19's held-out gpt-oss trace: the sink steps sit between the score GEMM and the softmax
    b = _Builder()
    for _ in range(2):
        _eager_layer(b, 128, 128, _SINK_STEPS)
    r = analyze(b.write(tmp_path))
    assert r.layers_per_pass == (2,)
    assert {b.name: b.count for b in r.by_type}["attention"] == 2 * (len(_SINK_STEPS) + 3)


def test_eager_attention_whose_calls_split_into_several_kernels_is_attention(tmp_path: Path) -> None:
    # gpt-oss b1 s4096 (final-check-1248): the row max and the subtraction over 64 x 4096 x 4097 bf16 scores
    # (past 2^31 bytes) launch two kernels each, eight kernels between the score GEMM and the softmax
    b = _Builder()
    for _ in range(2):
        b.kernel("void at::native::vectorized_layer_norm_kernel<float>(int, float*)", ("aten::native_layer_norm",))
        b.kernel("cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16", ("aten::matmul", "aten::bmm"))
        for name, op in _SINK_STEPS:
            b.kernel(name, (op,), kernels=2 if op in ("aten::max", "aten::sub") else 1)
        b.kernel("void (anonymous namespace)::softmax_warp_forward<float>(float*)", ("aten::softmax", "aten::_softmax"))
        b.kernel("cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16", ("aten::matmul", "aten::bmm"))
        b.kernel(GEMM, ("aten::linear", "aten::addmm"))
    r = analyze(b.write(tmp_path))
    assert r.layers_per_pass == (2,)
    assert {b.name: b.count for b in r.by_type}["attention"] == 2 * (len(_SINK_STEPS) + 2 + 3)
    # seven distinct calls between the GEMM and the softmax are more than eager attention runs
    b = _Builder()
    for _ in range(2):
        _eager_layer(b, 128, 128, (*_SINK_STEPS, _SCALE, _SCALE))
    assert "attention" not in {t.name for t in analyze(b.write(tmp_path)).by_type}


def test_a_reduction_other_than_a_row_max_before_the_softmax_is_no_attention(tmp_path: Path) -> None:
    # a router's top-k between a batched GEMM and a softmax: no attention there, so no layer
    topk = ("void at::native::sbtopk::gatherTopK<float>(float*)", "aten::topk")
    b = _Builder()
    for _ in range(2):
        _eager_layer(b, 128, 128, (_SCALE, topk))
    r = analyze(b.write(tmp_path))
    assert r.layers_per_pass == () and "attention" not in {b.name for b in r.by_type}


COPY = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda"
    "(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::"
    "{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)"
    "::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda"
    "(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::"
    "{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&)::{lambda(int)#1})"
)
"""ATen's elementwise copy, as the TimeSformer trace names it."""
MATMUL_COPY = ("aten::matmul", "aten::reshape", "aten::clone", "aten::copy_")
"""The copy ``aten::matmul`` makes of a strided (transposed, permuted) input, outermost op first."""
BMM = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_64x1_nn_align8>(Params)"


def _timesformer_layer(b: _Builder) -> None:
    """TimeSformer's eager attention (the TraceLens H100 trace): ``torch.matmul`` of 4-D q, k and v copies
    its strided inputs inside ``aten::matmul`` before each ``bmm``, then a plain MLP."""
    b.kernel("void at::native::vectorized_layer_norm_kernel<float>(int, float*)", ("aten::native_layer_norm",))
    b.kernel(GEMM, ("aten::linear", "aten::addmm"))
    b.kernel(COPY, MATMUL_COPY)  # q
    b.kernel(COPY, MATMUL_COPY)  # k^T
    b.kernel(BMM, ("aten::matmul", "aten::bmm"), dims=[[96, 197, 64], [96, 64, 197]])
    b.kernel(*_SCALE[:1], (_SCALE[1],))
    b.kernel("void (anonymous namespace)::softmax_warp_forward<float>(float*)", ("aten::softmax", "aten::_softmax"))
    b.kernel(COPY, MATMUL_COPY)  # v
    b.kernel(BMM, ("aten::matmul", "aten::bmm"), dims=[[96, 197, 197], [96, 197, 64]])
    b.kernel(COPY, ("aten::reshape", "aten::clone", "aten::copy_"))
    b.kernel(GEMM, ("aten::linear", "aten::addmm"))
    b.kernel("void at::native::vectorized_layer_norm_kernel<float>(int, float*)", ("aten::native_layer_norm",))
    b.kernel(GEMM, ("aten::linear", "aten::addmm"))
    b.kernel("void at::native::GeluCUDAKernelImpl<float>(float*)", ("aten::gelu",))
    b.kernel(GEMM, ("aten::linear", "aten::addmm"))


def test_copies_inside_a_matmul_are_copies_and_both_bmm_of_eager_attention_are_attention(tmp_path: Path) -> None:
    b = _Builder()
    for _ in range(3):
        _timesformer_layer(b)
    data = load_trace_data(b.write(tmp_path))[0]
    from opgraph.trace import KernelClassifier

    KernelClassifier(PS).classify(data.gpu)
    kernels = [g for g in data.gpu if g.kind == "kernel"]
    bmm = [g for g in kernels if g.launch_op == "aten::bmm"]
    copies = [g for g in kernels if g.launch_op == "aten::copy_"]
    assert len(bmm) == 6 and len(copies) == 12
    # the score and the value GEMM of every attention: not the copy before the value GEMM
    assert {g.ktype for g in bmm} == {KernelType.ATTENTION}
    # the copies of q and k and after the attention are data movement; the copy of v lies inside the
    # attention (between its softmax and its value GEMM, as its scale does), so it counts as attention
    assert [g.ktype.value for g in copies[:4]] == ["memory", "memory", "attention", "memory"]
    assert KernelType.GEMM not in {g.ktype for g in copies}
    r = analyze(tmp_path / "t.json")
    types = {x.name: x.count for x in r.by_type}
    assert types["gemm"] == 3 * 4 and types["attention"] == 3 * 5 and types["memory"] == 3 * 3
    assert r.layers_per_pass == (3,)


def test_a_fixed_name_rule_holds_against_launch_rules(tmp_path: Path) -> None:
    name = "void my_ext::my_copy_kernel<float>(float*)"
    for fixed, expected in ((False, KernelType.GEMM), (True, KernelType.MEMORY)):
        rules = tmp_path / f"fixed_{fixed}.toml"
        rules.write_text(f'[[type]]\ntype = "memory"\nfixed = {str(fixed).lower()}\nmatch = ["my_copy_kernel"]\n')
        ps = load_patterns([rules], user_dirs=False)
        assert ps.name_type(name) == (KernelType.MEMORY, None, fixed)
        b = _Builder()
        b.kernel(name, ("aten::linear", "aten::addmm"))
        data = load_trace_data(b.write(tmp_path))[0]
        from opgraph.trace import KernelClassifier

        KernelClassifier(ps).classify(data.gpu)
        assert data.gpu[0].ktype is expected
    bad = tmp_path / "bad.toml"
    bad.write_text('[[type]]\ntype = "memory"\nfixed = "yes"\nmatch = ["x"]\n')
    with pytest.raises(PatternError, match="'fixed' must be true or false"):
        load_patterns([bad], user_dirs=False)


def test_gemm_in_a_library_namespace_is_no_gemm_op() -> None:
    # the param DLRM trace: fbgemm:: ops launch embedding lookups, scans and permutes
    assert PS.launch_type(("fbgemm::permute_2D_sparse_data",)) is None
    assert PS.launch_type(("fbgemm::asynchronous_complete_cumsum",)) is None
    assert PS.launch_type(("trtllm::fp8_block_scaling_gemm",)) is KernelType.GEMM
    assert PS.launch_type(("aten::mm", "aten::matmul", "aten::linear")) is KernelType.GEMM


_RMS = ("void at::native::vectorized_layer_norm_kernel<float>(int, float*)", "aten::native_layer_norm")
_TOPK = "void at::native::sbtopk::gatherTopK<float, unsigned int, 1, false>(at::cuda::detail::TensorInfo<float>)"
_SORT = "void at::native::bitonicSortKVInPlace<-2, -1, 16, 16, float, long>(at::cuda::detail::TensorInfo<float>)"
_GATHER = "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)"
_SILU = "void at::native::elementwise_kernel<128, 4, at::native::silu_kernel<c10::BFloat16>>(int)"
_MUL = "void at::native::elementwise_kernel<128, 4, at::native::MulFunctor<float>>(int)"
_SUM = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float>>>(float*)"
_GROUPED = "void at::cuda::detail::prepare_grouped_gemm_data<cutlass::bfloat16_t>(cutlass::bfloat16_t*)"
_EXPERT_BMM = "nvjet_sm90_tst_128x8_64x12_4x1_v_bz_TNT"
_ARGMAX = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ArgMaxOps<float>>>"
_EMBED = "void at::native::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>(int)"
_ROPE_BMM = "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(Params)"


def _moe_layer(b: _Builder, tokens: int, *, decode: bool) -> None:
    """A transformers MoE decoder layer (the HF Qwen3-MoE trace): SDPA attention, a router, then the experts
    as ``_grouped_mm`` (prefill) or, for one token, gathered expert weights and one ``bmm`` each (decode)."""
    b.kernel(*_RMS[:1], (_RMS[1],))
    b.kernel(GEMM, ("aten::linear", "aten::matmul", "aten::mm"))
    b.kernel(
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0",
        ("aten::scaled_dot_product_attention", "aten::_cudnn_attention_forward"),
        dims=[[1, 32, tokens, 128], [1, 32, tokens, 128], [1, 32, tokens, 128]],
    )
    b.kernel(GEMM, ("aten::linear", "aten::matmul", "aten::mm"))
    b.kernel(*_RMS[:1], (_RMS[1],))
    b.kernel(GEMM, ("aten::linear", "aten::matmul", "aten::mm"))  # router logits
    b.kernel("void (anonymous namespace)::softmax_warp_forward<float>(float*)", ("aten::softmax", "aten::_softmax"))
    b.kernel(_TOPK, ("aten::topk",))
    b.kernel(_SORT, ("aten::topk",))
    if decode:
        b.kernel(COPY, ("aten::repeat_interleave", "aten::clone", "aten::copy_"))
        b.kernel(_GATHER, ("aten::index",), dims=[[64, 1536, 2048], []])
        b.kernel(_EXPERT_BMM, ("aten::bmm",), dims=[[8, 1536, 2048], [8, 2048, 1]])
        b.kernel(_SILU, ("aten::silu",))
        b.kernel(_MUL, ("aten::mul",))
        b.kernel(_GATHER, ("aten::index",), dims=[[64, 2048, 768], []])
        b.kernel(_EXPERT_BMM, ("aten::bmm",), dims=[[8, 2048, 768], [8, 768, 1]])
    else:
        b.kernel(_GATHER, ("aten::index",), dims=[[tokens, 2048], []])
        b.kernel(_GROUPED, ("aten::_grouped_mm",))
        b.kernel(GEMM, ("aten::_grouped_mm",))
        b.kernel(_SILU, ("aten::silu",))
        b.kernel(_MUL, ("aten::mul",))
        b.kernel(_GROUPED, ("aten::_grouped_mm",))
        b.kernel(GEMM, ("aten::_grouped_mm",))
    b.kernel(_MUL, ("aten::mul",))
    b.kernel(_SUM, ("aten::sum",))


def _moe_pass(b: _Builder, tokens: int, *, decode: bool) -> None:
    """Embedding, RoPE's angles (a batch-1 ``bmm`` in transformers 5.17), 2 layers, LM head, then a top-k
    sampler: its top-k is no router, and no GEMM after it is an expert's."""
    b.kernel(_EMBED, ("aten::embedding", "aten::index_select"))
    b.kernel(_ROPE_BMM, ("aten::matmul", "aten::bmm"), dims=[[1, 64, 1], [1, 1, tokens]])
    for _ in range(2):
        _moe_layer(b, tokens, decode=decode)
    b.kernel(*_RMS[:1], (_RMS[1],))
    b.kernel(GEMM, ("aten::linear", "aten::matmul", "aten::mm"))
    b.kernel(_TOPK, ("aten::topk",))
    b.kernel(_ARGMAX, ("aten::argmax",))


def test_expert_gemms_are_moe_in_decode_as_in_prefill(tmp_path: Path) -> None:
    b = _Builder()
    _moe_pass(b, 64, decode=False)
    for _ in range(2):
        _moe_pass(b, 1, decode=True)
    data = load_trace_data(b.write(tmp_path))[0]
    from opgraph.trace import KernelClassifier

    KernelClassifier(PS).classify(data.gpu)
    kernels = [g for g in data.gpu if g.kind == "kernel"]
    expert = [g for g in kernels if g.launch_op in ("aten::bmm", "aten::_grouped_mm") and g.name != _ROPE_BMM]
    assert len(expert) == 2 * 4 + 2 * 2 * 2
    assert {g.ktype for g in expert} == {KernelType.MOE}
    # RoPE's bmm after the embedding (and the sampler's top-k before it) is no expert's; nor are the
    # weight gathers (copies) and the dense GEMMs of the block
    rope = [g for g in kernels if g.name == _ROPE_BMM]
    assert len(rope) == 3 and {g.ktype for g in rope} == {KernelType.GEMM}
    assert {g.ktype for g in kernels if g.name == _GATHER} == {KernelType.MEMORY}
    r = analyze(tmp_path / "t.json")
    assert [p.stage for p in r.passes] == ["prefill", "decode", "decode"]
    assert {x.kind for x in r.layers} == {"MHA_MOE"}
    # MoE time: the router's top-k and sort, then the expert GEMMs (4 grouped-GEMM kernels in prefill, 2
    # bmm in decode), 3 us each; GEMM time: the attention projections and the router's logits only
    assert [(x.stage, x.moe_us, x.gemm_us) for x in r.layers] == [("prefill", 6 * 3.0, 3 * 3.0)] * 2 + [
        ("decode", 4 * 3.0, 3 * 3.0)
    ] * 4


def test_a_batched_gemm_after_the_moe_block_ends_is_no_expert_gemm(tmp_path: Path) -> None:
    # a norm ends the block: an eager attention's bmm after it keeps its GEMM type even right after a router
    b = _Builder()
    b.kernel(_TOPK, ("aten::topk",))
    b.kernel(*_RMS[:1], (_RMS[1],))
    b.kernel(_EXPERT_BMM, ("aten::bmm",))
    b.kernel(_TOPK, ("aten::topk",))
    b.kernel(_EXPERT_BMM, ("aten::mm",))  # an unbatched GEMM in the block: a shared expert's
    b.kernel(_EXPERT_BMM, ("aten::bmm",))
    data = load_trace_data(b.write(tmp_path))[0]
    from opgraph.trace import KernelClassifier

    KernelClassifier(PS).classify(data.gpu)
    assert [g.ktype for g in data.gpu] == [
        KernelType.MOE,
        KernelType.NORM,
        KernelType.GEMM,
        KernelType.MOE,
        KernelType.GEMM,
        KernelType.MOE,
    ]


def _graph_layer(b: _Builder, dur: float) -> None:
    """A decoder layer replayed from a CUDA graph: no CPU op, so no shapes; a prefill-style attention name."""
    for name in ("triton_red_fused_add_mean_mul_rsqrt_0", GEMM, "flash_fwd_kernel", GEMM):
        b.kernel(name, dur=dur, launch="cudaGraphLaunch")
    for name in ("triton_red_fused_add_mean_mul_rsqrt_1", GEMM, "triton_poi_fused_mul_silu_2", GEMM):
        b.kernel(name, dur=dur, launch="cudaGraphLaunch")


@pytest.mark.parametrize(("graph_dur", "decode"), [(2.0, True), (9.0, False)])
def test_passes_replaying_cuda_graphs_after_an_eager_pass_are_decode_when_shorter(
    tmp_path: Path, graph_dur: float, decode: bool
) -> None:
    # issue 19's held-out static-cache generate: an eager prefill, then decode steps replayed from CUDA graphs
    argmax = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ArgMaxOps<float>>>"
    b = _Builder()
    for _ in range(2):
        _layer(b, "flash_fwd_kernel", attn_dur=5.0)
    b.kernel(argmax, ("aten::argmax",))
    for _ in range(3):
        for _ in range(2):
            _graph_layer(b, graph_dur)
        b.kernel(argmax, ("aten::argmax",))
    r = analyze(b.write(tmp_path))
    assert r.layers_per_pass == (2, 2, 2, 2)
    if decode:
        assert [p.stage for p in r.passes] == ["prefill", "decode", "decode", "decode"]
        assert any("replaying CUDA graphs" in n for n in r.notes)
    else:  # replayed layers as long as the eager ones: no evidence of decode
        assert [p.stage for p in r.passes] == ["unknown"] * 4


def test_a_profiler_step_around_a_generate_is_split_into_its_passes(tmp_path: Path) -> None:
    b = _Builder()
    for _ in range(3):  # prefill + 2 decode passes of 2 layers, each ending in argmax
        for _ in range(2):
            _layer(b, "flash_fwd_kernel")
        b.kernel(
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ArgMaxOps<float>>>", ("aten::argmax",)
        )
    b.events.append(_ev("user_annotation", "ProfilerStep#3", 900.0, b.t - 800.0))
    r = analyze(b.write(tmp_path))
    assert r.layers_per_pass == (2, 2, 2)
    assert {p.annotation for p in r.passes} == {"ProfilerStep#3"}


def test_upsample_is_no_sampling_kernel() -> None:
    # "sample" inside "upsample" must not end a generate pass
    name = "void at::native::(anonymous namespace)::upsample_nearest1d_out_frame<c10::BFloat16>(int, float)"
    assert PS.kernel_type(name)[0] is KernelType.ELEMENTWISE
    assert PS.kernel_type("void vllm::sample_tokens_kernel<float>(float*)")[0] is KernelType.SAMPLING


def test_each_kernel_type_is_the_span_category_of_its_name() -> None:
    # A measured kernel's span carries its type as its category: the same name and the same saved string.
    for ktype in KernelType:
        category = SpanCategory[ktype.name]
        assert category == ktype and SpanCategory(ktype.value) is category and category.is_device
