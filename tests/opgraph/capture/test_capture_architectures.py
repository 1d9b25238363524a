"""Tiny configs of many decoder architectures: lowered with no FLOP-costing ``other``, and the graph
captured on ``meta`` equals the one captured on ``cpu`` with real random-weight tensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from opgraph.capture import capture
from opgraph.ir import DType, OpGraph, OpKind
from tests.conftest import TINY_LLAMA

# The shared tiny Llama's sizes, with room for longer positions and an explicit head_dim.
BASE: dict[str, Any] = {
    **{k: v for k, v in TINY_LLAMA.items() if k not in ("model_type", "architectures")},
    "max_position_embeddings": 256,
    "head_dim": 16,
}
TINY: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", {}),
    "mistral": ("MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3ForCausalLM", {}),
    "qwen3_moe": ("Qwen3MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "mixtral": ("MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "gemma": ("GemmaForCausalLM", {}),
    "gemma2": ("Gemma2ForCausalLM", {"sliding_window": 8}),
    "gemma3_text": ("Gemma3ForCausalLM", {"sliding_window": 8}),
    "phi3": ("Phi3ForCausalLM", {"pad_token_id": 0}),
    "gpt_oss": (
        "GptOssForCausalLM",
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "deepseek_v3": (
        "DeepseekV3ForCausalLM",
        {
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_group": 2,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "moe_intermediate_size": 32,
            "kv_lora_rank": 16,
            "q_lora_rank": 32,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "num_key_value_heads": 4,
            "head_dim": 8,
        },
    ),
    "bloom": ("BloomForCausalLM", {"n_layer": 2, "n_head": 4}),
    "olmo2": ("Olmo2ForCausalLM", {}),
    "starcoder2": ("Starcoder2ForCausalLM", {"sliding_window": None}),
    "granite": ("GraniteForCausalLM", {}),
}


def tiny_config(tmp_path: Path, model_type: str) -> str:
    """Write the tiny config of ``model_type`` and return its path."""
    arch, extra = TINY[model_type]
    cfg = {**BASE, **extra, "model_type": model_type, "architectures": [arch]}
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def structure(g: OpGraph) -> list[tuple[Any, ...]]:
    """What must agree between devices: ops with shapes, FLOPs, bytes, scope, and the edges."""
    ops = [
        (
            o.kind,
            o.definition,
            o.flops,
            o.bytes_read,
            o.bytes_written,
            o.scope,
            o.layer,
            tuple(t.shape for t in o.inputs),
            tuple(t.shape for t in o.outputs),
        )
        for o in g.ops
    ]
    return [*ops, *((e.src, e.dst) for e in g.edges)]


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_no_flop_costing_other_and_meta_equals_cpu(tmp_path: Path, model_type: str) -> None:
    path = tiny_config(tmp_path, model_type)
    meta = capture(path, seq_len=12, device="meta")
    meta.lint()
    costly_other = [(o.definition, o.flops) for o in meta.ops if o.kind is OpKind.OTHER and o.flops > 0]
    assert not costly_other, costly_other
    kinds = {o.kind for o in meta.ops}
    assert {OpKind.GEMM, OpKind.ATTENTION, OpKind.NORM, OpKind.EMBEDDING} <= kinds
    assert len(meta.ops_of(OpKind.ATTENTION)) == 2  # one per layer
    # The same routing on both (a real device runs the model's own router unless told otherwise).
    cpu = capture(path, seq_len=12, device="cpu", moe_skew=0.0)
    assert structure(meta) == structure(cpu)


def test_at_least_twelve_architectures() -> None:
    assert len(TINY) >= 12


@pytest.mark.parametrize("model_type", ["qwen3_moe", "deepseek_v3"])
def test_moe_expert_gemms_and_routing(tmp_path: Path, model_type: str) -> None:
    g = capture(tiny_config(tmp_path, model_type), seq_len=8)
    expert = [o for o in g.ops_of(OpKind.GEMM) if o.definition.startswith("moe_")]
    assert expert and all("_e4_h64_" in o.definition and "_topk2_" in o.definition for o in expert)
    # Balanced routing: 8 tokens x top-2 over 4 experts -> 4 rows per expert.
    assert all(o.groups == 4 and o.m == 4 for o in expert)  # type: ignore[attr-defined]
    fns = {o.fn for o in g.ops_of(OpKind.MOE_ROUTING)}  # type: ignore[attr-defined]
    assert {"route", "dispatch", "combine"} <= fns
    assert any("MoE routing is modelled" in a for a in g.metadata.assumptions)


def test_moe_skew_changes_expert_loads(tmp_path: Path) -> None:
    path = tiny_config(tmp_path, "qwen3_moe")
    # fp16: no grouped kernel, one product per expert (a bf16 grouped kernel holds the mean rows only).
    balanced = capture(path, seq_len=8, dtype="fp16")
    skewed = capture(path, seq_len=8, dtype="fp16", moe_skew=1.5)

    def flops(g: OpGraph) -> int:
        return sum(o.flops for o in g.ops_of(OpKind.GEMM) if o.definition.startswith("moe_"))

    assert flops(balanced) == flops(skewed)  # the same token-expert pairs, differently spread

    def loads(g: OpGraph) -> list[tuple[int, int]]:
        gemms = [o for o in g.ops_of(OpKind.GEMM) if o.definition.startswith("moe_")]
        return sorted((o.m, o.groups) for o in gemms)  # type: ignore[attr-defined]

    assert loads(balanced) != loads(skewed)
    assert any("Zipf" in a for a in skewed.metadata.assumptions)


def test_mla_attention(tmp_path: Path) -> None:
    g = capture(tiny_config(tmp_path, "deepseek_v3"), seq_len=8)
    att = g.ops_of(OpKind.ATTENTION)[0]
    assert att.variant.value == "mla"  # type: ignore[attr-defined]
    assert att.head_dim == 24 and att.head_dim_v == 16  # type: ignore[attr-defined]


def test_eager_attention_records_the_kernels_it_runs_over_its_scores(tmp_path: Path) -> None:
    # HF's eager_attention_forward: scores = q @ k^T * scale, + mask, softmax in float32, cast back, @ v.
    path = tiny_config(tmp_path, "llama")
    sdpa = capture(path, seq_len=8, attn_impl="sdpa").ops_of(OpKind.ATTENTION)
    eager = capture(path, seq_len=8, attn_impl="eager").ops_of(OpKind.ATTENTION)
    assert sdpa[0].definition == "gqa_ragged_prefill_causal_h4_kv2_d16" and sdpa[0].eager is None  # type: ignore[attr-defined]
    assert eager[0].definition == "eager_gqa_ragged_prefill_causal_h4_kv2_d16"
    passes = eager[0].eager  # type: ignore[attr-defined]
    assert [(p.kind.value, p.fn, p.dtype.value) for p in passes] == [
        ("elementwise", "mul", "bf16"),
        ("elementwise", "add", "bf16"),
        ("memory", "cast", "bf16"),  # a cast carries the dtype it reads, as a graph's casts do
        ("softmax", "_softmax", "fp32"),
        ("memory", "cast", "fp32"),
    ]
    # bytes per score: the softmax reads and writes float32, the casts change the width
    assert [(p.read, p.written) for p in passes if p.fn != "add"] == [(2, 2), (2, 4), (4, 4), (4, 2)]
    # eager multiplies every query-key pair (the mask zeroes weights afterwards); SDPA skips the masked
    b, h, s, d = 1, 4, 8, 16
    assert eager[0].flops == 2 * b * h * s * s * 2 * d
    assert sdpa[0].flops == 2 * b * h * (s * (s + 1) // 2) * 2 * d


def test_half_scores_softmaxed_in_float32_are_one_kernel_as_cuda_runs_them(tmp_path: Path) -> None:
    # softmax(x, dtype=float32) of half x: on CUDA ATen's _softmax(half_to_float=True), one kernel reading
    # half; meta records a cast before it, which capture folds in. bfloat16 has no such path: its cast stays.
    path = tiny_config(tmp_path, "llama")
    (half,) = capture(path, seq_len=8, attn_impl="eager", dtype="fp16", layers=1).ops_of(OpKind.ATTENTION)
    passes = half.eager  # type: ignore[attr-defined]
    assert [(p.kind.value, p.fn, p.dtype.value, p.read, p.written) for p in passes if p.fn != "add"] == [
        ("elementwise", "mul", "fp16", 2, 2),
        ("softmax", "_softmax", "fp32", 2, 4),
        ("memory", "cast", "fp32", 4, 2),
    ]


def test_sink_attention_runs_its_sinks_cat_max_and_subtraction(tmp_path: Path) -> None:
    g = capture(tiny_config(tmp_path, "gpt_oss"), seq_len=16)  # no SDPA path in transformers
    passes = g.ops_of(OpKind.ATTENTION)[0].eager  # type: ignore[attr-defined]
    fns = [p.fn for p in passes]
    assert fns[fns.index("cat") :][:4] == ["cat", "max", "sub", "_softmax"]
    # from the cat on, every row holds the sink column too
    assert [p.extra_cols for p in passes] == [0] * fns.index("cat") + [1] * (len(fns) - fns.index("cat"))
    # what reads an operand broadcast over the scores: the mask over the heads, the sinks expanded over
    # the queries, the row maximum; not the scale (by a scalar) or the row maximum and softmax themselves
    assert [p.fn for p in passes if p.broadcast] == ["add", "cat", "sub"]


def test_sliding_window_layers(tmp_path: Path) -> None:
    g = capture(tiny_config(tmp_path, "gpt_oss"), seq_len=16)
    windows = [o.window for o in g.ops_of(OpKind.ATTENTION)]  # type: ignore[attr-defined]
    assert windows == [8, None]


# Tiny configs of decoders without rotary positions: learned position embeddings (OPT, GPT-2) and a
# state-space model with no attention at all (Mamba).
NO_ROPE: dict[str, dict[str, Any]] = {
    "opt": {
        "architectures": ["OPTForCausalLM"],
        "hidden_size": 64,
        "ffn_dim": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 128,
        "max_position_embeddings": 64,
        "word_embed_proj_dim": 64,
    },
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128},
    "mamba": {
        "architectures": ["MambaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "vocab_size": 128,
        "state_size": 8,
        "intermediate_size": 128,
    },
}


def _capture_no_rope(tmp_path: Path, model_type: str) -> OpGraph:
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps({**NO_ROPE[model_type], "model_type": model_type}))
    return capture(str(path), seq_len=12)


@pytest.mark.parametrize("model_type", ["opt", "gpt2"])
def test_learned_positions_are_embeddings_not_rope(tmp_path: Path, model_type: str) -> None:
    g = _capture_no_rope(tmp_path, model_type)
    assert not g.ops_of(OpKind.ROPE), [o.scope for o in g.ops_of(OpKind.ROPE)]
    scopes = {o.scope.rsplit(".", 1)[-1] for o in g.ops_of(OpKind.EMBEDDING)}
    assert scopes == ({"embed_tokens", "embed_positions"} if model_type == "opt" else {"wte", "wpe"})


def test_an_activation_written_in_python_is_the_kernels_eager_runs(tmp_path: Path) -> None:
    # BLOOM's bloom_gelu_forward: x * 0.5 * (1.0 + tanh(0.79788456 * x * (1 + 0.044715 * x * x))), one
    # kernel per aten call in eager PyTorch (priced as one GELU kernel, its prefill measured 3.7x that)
    g = capture(tiny_config(tmp_path, "bloom"), seq_len=8)
    gelu = [o for o in g.ops if o.layer == 0 and (o.scope or "").endswith("mlp.gelu_impl")]
    assert sorted(o.definition.split("_")[0] for o in gelu) == ["add", "add", *["mul"] * 6, "tanh"]
    assert all(o.call is not None for o in gelu)  # each lowered from one aten call
    assert {o.kind for o in gelu} == {OpKind.ELEMENTWISE, OpKind.ACTIVATION}
    # by a Python number (x * 0.5, 1.0 + t: one tensor read, another kernel) or of two tensors
    scalar = sorted(o.fn for o in gelu if getattr(o, "scalar", False))  # type: ignore[attr-defined]
    assert scalar == ["add", "add", "mul", "mul", "mul"]  # as the trace's kernels: three of two tensors
    assert all(o.definition.startswith(f"{o.fn}_scalar_h") for o in gelu if getattr(o, "scalar", False))  # type: ignore[attr-defined]


def test_an_alibi_baddbmm_copies_its_addend_into_the_scores_first(tmp_path: Path) -> None:
    # BLOOM: baddbmm(alibi [b*h, 1, kv], q, k^T, beta=1): ATen copies the alibi expanded over the queries
    # into the output (a kernel of its own), then accumulates the matmul onto it
    g = capture(tiny_config(tmp_path, "bloom"), seq_len=8, attn_impl="eager", dtype="fp16", layers=1)
    (att,) = g.ops_of(OpKind.ATTENTION)
    first = att.eager[0]  # type: ignore[attr-defined]
    assert (first.kind, first.fn, first.addend, first.broadcast) == (OpKind.MEMORY, "addend", True, True)
    assert (first.written, first.dtype) == (2, DType.fp16) and 0 < first.read < 2  # the alibi: a row per head
    assert not any(p.addend for p in att.eager[1:])  # type: ignore[attr-defined]


def test_query_scaling_is_an_elementwise_mul(tmp_path: Path) -> None:
    # OPT scales q_proj(x) by head_dim ** -0.5 (here 0.25) before attention: a multiply by a scalar.
    g = _capture_no_rope(tmp_path, "opt")
    scaled = [o for o in g.ops_of(OpKind.ELEMENTWISE) if o.scope.endswith("self_attn")]
    assert [o.fn for o in scaled] == ["mul", "mul"]  # type: ignore[attr-defined]
    assert all(o.scalar and o.bytes_read == o.bytes_written for o in scaled)  # type: ignore[attr-defined]


def test_model_without_attention_claims_no_attention_implementation(tmp_path: Path) -> None:
    g = _capture_no_rope(tmp_path, "mamba")
    assert not g.ops_of(OpKind.ATTENTION) and not g.ops_of(OpKind.ROPE)
    assert not [a for a in g.metadata.assumptions if "attention" in a], g.metadata.assumptions


def test_a_model_that_falls_back_to_eager_attention_says_so(tmp_path: Path) -> None:
    g = capture(tiny_config(tmp_path, "gemma2"), seq_len=8)
    if g.metadata.capture.attn_impl == "sdpa" and not g.metadata.assumptions:
        pytest.skip("this transformers runs Gemma-2 with sdpa")
    assert any("captured with eager attention" in a for a in g.metadata.assumptions)


def test_generate_keeps_each_forward_pass_expert_plan(tmp_path: Path) -> None:
    # Each experts call is lowered with the routing of that call: the prefill of a generate graph
    # has the expert loads of a prefill graph, not those of the last decode step.
    path = tiny_config(tmp_path, "qwen3_moe")

    def moe_ops(g: OpGraph, stage: str | None) -> list[tuple[str, int, int]]:
        return [
            (o.definition, o.flops, o.bytes_read)
            for o in g.ops
            if o.definition.startswith("moe_") and (stage is None or (o.stage and o.stage.value == stage))
        ]

    prefill = capture(path, seq_len=8)
    generate = capture(path, phase="generate", seq_len=8, new_tokens=2)
    assert moe_ops(generate, "prefill") == moe_ops(prefill, None)
    experts = [o for o in generate.ops_of(OpKind.GEMM) if o.definition.startswith("moe_")]
    assert [(o.groups, o.m) for o in experts if o.step == 0] == [(4, 4), (4, 4)] * 2  # type: ignore[attr-defined]
    assert {(o.groups, o.m) for o in experts if o.step} == {(2, 1)}  # type: ignore[attr-defined]
