"""Rebatching a captured graph equals a fresh capture at the target shape, op for op."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from opgraph.ir import OpGraph, OpKind
from opgraph.ir.configs import is_contiguous
from opgraph.ir.ops import Attention, Gemm
from opgraph.transforms import (
    TEMPLATE_DECODE,
    TEMPLATE_PREFILL,
    AttentionPart,
    RebatchError,
    mixed_step,
    rebatch,
)
from opgraph.transforms.rebatch import template_windows
from tests.conftest import TINY_LLAMA

TINY_MOE: dict[str, object] = {
    **TINY_LLAMA,
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}
_MLA = {"kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16}
# Tiny configs of each MoE family the presets ship (and MLA, sliding windows, eager attention with
# sinks): 16 experts top-4 reach all at the template sizes but only 4 for one token, so per-expert
# GEMMs come and go; 32 experts top-4 are not all reached by the 13-token decode template.
MOE_FAMILIES: dict[str, dict[str, object]] = {
    "qwen3_moe": {
        **TINY_LLAMA,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 32,
        "head_dim": 16,
    },
    "gpt_oss": {
        **TINY_LLAMA,
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "head_dim": 16,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "deepseek_v3": {
        **TINY_LLAMA,
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 32,
        "num_key_value_heads": 4,
        "head_dim": 8,
        **_MLA,
    },
    "mixtral_eager": {**TINY_MOE, "experts_implementation": "eager"},
}
WINDOW = 48
"""A sliding window longer than the template sizes (prefill 37 tokens, decode 41 + 1 keys): a template
shows no window at work, as the presets' (128 and 1024) show none."""
CONFIGS = {
    "llama": TINY_LLAMA,
    "moe": TINY_MOE,
    **MOE_FAMILIES,
    "qwen3_moe32": {**MOE_FAMILIES["qwen3_moe"], "num_experts": 32},
    "llama_i41": {**TINY_LLAMA, "intermediate_size": 41},
    # Room for contexts well past the window and past the templates.
    "gpt_oss_w48": {**MOE_FAMILIES["gpt_oss"], "sliding_window": WINDOW, "max_position_embeddings": 256},
    "deepseek_v3_long": {**MOE_FAMILIES["deepseek_v3"], "max_position_embeddings": 256},
    # SDPA with sliding windows: Qwen2's layer types (one sliding, one full), Mistral's every layer sliding.
    "qwen2_sw": {
        **TINY_LLAMA,
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "sliding_window": WINDOW,
        "use_sliding_window": True,
        "max_window_layers": 0,
        "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 256,
    },
    "mistral_sw": {
        **TINY_LLAMA,
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "sliding_window": WINDOW,
        "max_position_embeddings": 256,
    },
}


def _gemma3_sw() -> dict[str, object]:
    """The shipped Gemma 3 preset's text config, tiny, one sliding and one full layer."""
    preset = Path(__file__).resolve().parents[3] / "opgraph" / "capture" / "presets" / "gemma-3-27b.json"
    config: dict[str, object] = json.loads(preset.read_text())["config"]
    config.pop("sliding_window_pattern", None)
    tiny = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    tiny |= {"num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "query_pre_attn_scalar": 16}
    tiny |= {"sliding_window": WINDOW, "max_position_embeddings": 256}
    return {**config, **tiny, "layer_types": ["sliding_attention", "full_attention"]}


CONFIGS["gemma3_sw"] = _gemma3_sw()


@cache
def _config_path(name: str) -> str:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=f"rebatch_{name}_"))
    path = folder / "config.json"
    path.write_text(json.dumps(CONFIGS[name]))
    return str(path)


@cache
def _capture(name: str, phase: str, batch: int, size: int, dtype: str = "bf16") -> OpGraph:
    from opgraph.capture import capture

    if phase == "prefill":
        return capture(_config_path(name), phase="prefill", batch=batch, seq_len=size, dtype=dtype)
    return capture(_config_path(name), phase="decode", batch=batch, kv_len=size, dtype=dtype)


def _template(name: str, phase: str, dtype: str = "bf16") -> OpGraph:
    t = TEMPLATE_PREFILL if phase == "prefill" else TEMPLATE_DECODE
    return _capture(name, phase, t["batch"], t["seq_len"] if phase == "prefill" else t["kv_len"], dtype)


def _cost_view(op: Any) -> dict[str, Any]:
    skip = {"id", "target", "scope", "call", "inputs", "outputs", "host_gap_us", "stage", "step"}
    fields = {k: v for k, v in op.__dict__.items() if k not in skip}
    fields["outputs"] = [t.shape for t in op.outputs]
    # an input's layout prices a layout-bound op (a KV-cache write out of a transposed view)
    fields["strided_inputs"] = [not is_contiguous(t.shape, t.strides) for t in op.inputs]
    return fields


@pytest.mark.parametrize("name", ["llama", "moe"])
@pytest.mark.parametrize(
    ("phase", "batch", "size"), [("prefill", 3, 9), ("prefill", 5, 21), ("decode", 3, 11), ("decode", 5, 30)]
)
def test_rebatch_equals_fresh_capture(name: str, phase: str, batch: int, size: int) -> None:
    # Token counts whose expert pairs do not split evenly over the 4 experts: an even split makes
    # the capture pick the batched expert kernel, a structure the template (uneven) does not have.
    fresh = _capture(name, phase, batch, size)
    if phase == "prefill":
        got = rebatch(_template(name, phase), batch=batch, q_len=size)
    else:
        got = rebatch(_template(name, phase), batch=batch, kv_len=size + 1)
    assert len(got.ops) == len(fresh.ops)
    for a, b in zip(got.ops, fresh.ops, strict=True):
        assert _cost_view(a) == _cost_view(b), (a.id, a.kind)
    assert got.edges == _template(name, phase).edges


def test_rebatch_decode_rejects_q_len_above_one() -> None:
    with pytest.raises(RebatchError, match="q_len=1"):
        rebatch(_template("llama", "decode"), batch=2, q_len=4)


def test_ambiguous_template_sizes_are_refused() -> None:
    # batch 4 equals the tiny model's head count: a dimension 4 could be either.
    g = _capture("llama", "prefill", 4, 9)
    with pytest.raises(RebatchError, match="model size"):
        rebatch(g, batch=2, q_len=3)


def test_prefill_chunk_over_prefix_reads_the_prefix() -> None:
    g = rebatch(_template("llama", "prefill"), batch=1, q_len=8, kv_len=24)
    attn = [o for o in g.ops if isinstance(o, Attention)]
    assert attn and all(a.q_len == 8 and a.kv_len == 24 for a in attn)
    # Causal chunk over a 16-token prefix: each of 8 queries sees 17..24 keys (independent count).
    heads, d = attn[0].heads, attn[0].head_dim
    pairs = sum(range(17, 25))
    assert attn[0].flops == 2 * heads * pairs * 2 * d


def test_mixed_step_holds_both_attentions_and_all_tokens() -> None:
    pre, dec = _template("llama", "prefill"), _template("llama", "decode")
    g = mixed_step(pre, dec, [AttentionPart(1, 6, 6)], AttentionPart(3, 1, 20))
    attn = [o for o in g.ops if isinstance(o, Attention)]
    layers = TINY_LLAMA["num_hidden_layers"]
    assert sorted((a.batch, a.q_len, a.kv_len) for a in attn) == [(1, 6, 6)] * layers + [(3, 1, 20)] * layers
    gemms: list[Any] = list(g.ops_of(OpKind.GEMM))
    assert {o.m for o in gemms if "bmm" not in o.target} == {6 + 3}
    # transformers 5.17 computes RoPE's angles as a bmm inv_freq @ positions (5.24 multiplies): over all tokens
    assert all(o.n == 6 + 3 for o in gemms if "bmm" in o.target)
    g.lint()


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_rebatch_like_reuses_kv_independent_ops_and_equals_a_full_rebatch(phase: str) -> None:
    t = _template("llama", phase)
    if phase == "decode":
        like = rebatch(t, batch=3, kv_len=9)
        full, got = rebatch(t, batch=3, kv_len=25), rebatch(t, batch=3, kv_len=25, like=like)
    else:
        like = rebatch(t, batch=1, q_len=8, kv_len=8)
        full, got = rebatch(t, batch=1, q_len=8, kv_len=30), rebatch(t, batch=1, q_len=8, kv_len=30, like=like)
    assert [_cost_view(o) for o in got.ops] == [_cost_view(o) for o in full.ops]
    if phase == "prefill":  # a chunk with its mask ops lends nothing: rewritten in full
        again = rebatch(t, batch=1, q_len=8, kv_len=40, like=full)
        assert [_cost_view(o) for o in again.ops] == [
            _cost_view(o) for o in rebatch(t, batch=1, q_len=8, kv_len=40).ops
        ]
    with pytest.raises(RebatchError, match="same batch"):
        rebatch(t, batch=2, q_len=None if phase == "decode" else 8, kv_len=30, like=like)


@pytest.mark.parametrize("name", ["llama", "moe"])
def test_shared_tensor_ids_keep_the_costs(name: str) -> None:
    t = _template(name, "prefill")
    full, fast = rebatch(t, batch=3, q_len=9), rebatch(t, batch=3, q_len=9, tensor_ids=False)
    assert [_cost_view(o) for o in fast.ops] == [_cost_view(o) for o in full.ops]
    # Repeated layers now share tensor ids: fewer distinct ids than the faithful rebatch.
    ids = {t.id for o in fast.ops for t in (*o.inputs, *o.outputs)}
    assert len(ids) < len({t.id for o in full.ops for t in (*o.inputs, *o.outputs)})


# ---------------------------------------------------------------- experts calls of every MoE family
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(MOE_FAMILIES))
@pytest.mark.parametrize(
    ("phase", "batch", "size"), [("prefill", 3, 9), ("prefill", 1, 3), ("decode", 3, 11), ("decode", 1, 9)]
)
def test_moe_rebatch_equals_fresh_capture(name: str, dtype: str, phase: str, batch: int, size: int) -> None:
    # bf16: one grouped GEMM per projection (rows, active experts and their weights' bytes re-derived);
    # fp16 and the eager loop: one GEMM per routed expert, the idle ones' dropped. A fresh capture is the
    # independent reference: it runs the model's own experts code on meta with the new token count.
    fresh = _capture(name, phase, batch, size, dtype)
    template = _template(name, phase, dtype)
    got = (
        rebatch(template, batch=batch, q_len=size)
        if phase == "prefill"
        else rebatch(template, batch=batch, kv_len=size + 1)
    )
    assert [_cost_view(o) for o in got.ops] == [_cost_view(o) for o in fresh.ops]
    got.lint()


def test_dropped_expert_gemms_keep_every_dependency_and_like_reuses_the_rest() -> None:
    import networkx as nx

    t = _template("qwen3_moe", "decode", "fp16")
    one = rebatch(t, batch=1, kv_len=9)  # one token reaches 4 of the 16 experts
    experts = [o for o in one.ops if o.kind is OpKind.GEMM and o.target.startswith("moe_experts")]
    assert len(experts) == 2 * 4 * 2  # gate_up and down of 4 experts, in 2 layers
    assert [o.id for o in one.ops] == list(range(len(one.ops)))
    g = one.to_networkx()
    combines = [o.id for o in one.ops if getattr(o, "fn", "") == "combine"]
    dispatches = [o.id for o in one.ops if getattr(o, "fn", "") == "dispatch"]
    for d, c in zip(dispatches, combines, strict=True):
        inside = [o.id for o in experts if d < o.id < c]
        assert inside and all(nx.has_path(g, d, e) and nx.has_path(g, e, c) for e in inside)
    full, got = rebatch(t, batch=1, kv_len=30), rebatch(t, batch=1, kv_len=30, like=one)
    assert [_cost_view(o) for o in got.ops] == [_cost_view(o) for o in full.ops]
    assert got.edges == full.edges


def test_per_expert_template_missing_experts_is_refused_and_template_shape_fixes_it() -> None:
    from opgraph.capture.moe_model import expected_active
    from opgraph.transforms import check_template, template_shape

    t = _template("qwen3_moe32", "decode", "fp16")  # 13 tokens reach 26 of 32 experts
    with pytest.raises(RebatchError, match="GEMMs for 26 of 32 experts"):
        rebatch(t, batch=40, kv_len=12)
    with pytest.raises(RebatchError, match="at least 32 tokens"):
        check_template(t)
    assert rebatch(t, batch=2, kv_len=12).ops  # fewer experts than the template holds: fine
    sizes = template_shape("decode", refused=t)
    assert expected_active(32, sizes["batch"], 4) == 32
    again = _capture("qwen3_moe32", "decode", sizes["batch"], sizes["kv_len"], "fp16")
    check_template(again)
    fresh = _capture("qwen3_moe32", "decode", 40, 11, "fp16")
    got = rebatch(again, batch=40, kv_len=12)
    assert [_cost_view(o) for o in got.ops] == [_cost_view(o) for o in fresh.ops]


def test_template_shape_avoids_a_model_size_that_clashes() -> None:
    from opgraph.transforms import check_template, template_shape

    t = _template("llama_i41", "decode")  # intermediate size 41 = the template's cache length
    with pytest.raises(RebatchError, match="model size"):
        check_template(t)
    sizes = template_shape("decode", refused=t)
    assert sizes["kv_len"] not in (40, 41) and sizes["kv_len"] + 1 != 41
    again = _capture("llama_i41", "decode", sizes["batch"], sizes["kv_len"])
    check_template(again)
    fresh = _capture("llama_i41", "decode", 3, 20)
    assert [_cost_view(o) for o in rebatch(again, batch=3, kv_len=21).ops] == [_cost_view(o) for o in fresh.ops]


def test_serving_templates_reach_every_expert_of_a_per_expert_model() -> None:
    from opgraph.scenario.serving import capture_serving_model
    from opgraph.transforms import check_template

    model = capture_serving_model(_config_path("qwen3_moe32"), dtype="fp16")
    check_template(model.prefill)
    check_template(model.decode)
    assert model.decode.metadata.capture.batch != TEMPLATE_DECODE["batch"]


# ---------------------------------------------------------------- what runs over the keys
@cache
def _capture_chunk(name: str, batch: int, prefix: int, q_len: int) -> OpGraph:
    """transformers itself running a chunk of ``q_len`` tokens over a cache of ``prefix`` tokens (filled
    unrecorded, as a decode capture fills it), recorded and lowered like any capture: the reference for
    a prefill template rebatched to a chunk over a prefix."""
    import torch

    from opgraph.capture.api import _metadata_args, graph_from_recording, prepare
    from opgraph.capture.phase import CaptureOptions, PhaseRun, setup_phase, token_ids
    from opgraph.capture.recorder import Recorder

    opts = CaptureOptions(phase="decode", batch=batch, kv_len=prefix, dtype="bf16")
    prepared = prepare(_config_path(name), opts)
    cache_ = setup_phase(prepared, opts)
    rec = Recorder()
    rec.add_root(prepared.model)
    with torch.no_grad():
        PhaseRun(prepared, opts, rec, cache_).forward(token_ids(prepared, opts, batch, q_len, seed=2), "prefill", 0)
    graph, _ = graph_from_recording(rec, **_metadata_args(prepared, opts))
    return graph


def _attention_kv(g: OpGraph) -> list[tuple[int | None, int, int, int | None]]:
    return [(o.layer, o.batch, o.kv_len, o.window) for o in g.ops if isinstance(o, Attention)]


@pytest.mark.parametrize("cache_len", [20, WINDOW - 1, 99])
def test_sliding_decode_reads_the_window_as_a_fresh_capture(cache_len: int) -> None:
    # gpt-oss layers alternate sliding and full. transformers caps a sliding layer's cache at window - 1
    # tokens, so its decode reads min(cache + 1, window) keys, however short the template's cache was.
    got = rebatch(_template("gpt_oss_w48", "decode"), batch=3, kv_len=cache_len + 1)
    keys = cache_len + 1
    assert _attention_kv(got) == [(0, 3, min(keys, WINDOW), WINDOW), (1, 3, keys, None)]
    fresh = _capture("gpt_oss_w48", "decode", 3, cache_len)
    assert [_cost_view(o) for o in got.ops] == [_cost_view(o) for o in fresh.ops]


@pytest.mark.parametrize(
    ("name", "prefix", "q_len"),
    [
        ("gpt_oss_w48", 20, 11),  # every key inside the window
        ("gpt_oss_w48", 100, 11),  # the sliding layer reads window - 1 cached keys plus the chunk
        ("gpt_oss_w48", 100, 60),  # a chunk longer than the window: the window masks within it
        ("deepseek_v3_long", 50, 11),  # MLA up-projects the whole latent cache, prefix and chunk
    ],
)
def test_chunk_over_a_prefix_equals_transformers_running_it(name: str, prefix: int, q_len: int) -> None:
    # Every op, inside the layers and out (the masks eager attention reads are built outside them), and
    # every edge: as transformers runs the chunk.
    template = _template(name, "prefill")
    got = rebatch(template, batch=2, q_len=q_len, kv_len=prefix + q_len)
    fresh = _capture_chunk(name, 2, prefix, q_len)
    got.lint()
    assert [_cost_view(o) for o in got.ops] == [_cost_view(o) for o in fresh.ops]
    assert sorted((e.src, e.dst, e.kind) for e in got.edges) == sorted((e.src, e.dst, e.kind) for e in fresh.edges)
    # ``like``, at other keys, lends only the ops that do not depend on them.
    assert (
        rebatch(template, batch=2, q_len=q_len, kv_len=prefix + q_len, like=rebatch(template, batch=2, q_len=q_len)).ops
        == got.ops
    )
    if name == "deepseek_v3_long":  # kv_b_proj: the only GEMM from the latent rank (16)
        assert {o.m for o in got.ops_of(OpKind.GEMM) if o.k == 16} == {2 * (prefix + q_len)}  # type: ignore[attr-defined]
    else:
        sliding = min(prefix + q_len, WINDOW - 1 + q_len)
        assert _attention_kv(got) == [(0, 2, sliding, WINDOW), (1, 2, prefix + q_len, None)]
        # Eager attention reads a [batch, 1, queries, keys] mask per window, built outside the layers.
        masks = [o.outputs[0].shape for o in got.ops if o.layer is None and o.target == "aten.where.self"]
        assert sorted(masks) == sorted([(2, 1, q_len, prefix + q_len), (2, 1, q_len, sliding)])


@pytest.mark.parametrize(
    ("name", "batch", "prefix", "q_len"),
    [
        ("llama", 2, 20, 11),  # GQA: with a mask SDPA takes keys and values copied to every query head
        ("llama", 3, 5, 9),
        ("moe", 2, 30, 7),
        ("deepseek_v3_long", 2, 50, 11),  # MLA: as many key/value heads as query heads, no copies
    ],
)
def test_sdpa_chunk_over_a_prefix_builds_its_mask_as_transformers_does(
    name: str, batch: int, prefix: int, q_len: int
) -> None:
    # transformers skips the causal mask where queries and keys have one length (the template) but builds
    # it for a chunk over a prefix: every op, edge and simulated time equals its own run of that chunk.
    from hardware import load_hardware, resolve_cost_model
    from opgraph.study import run_study, study_config

    got = rebatch(_template(name, "prefill"), batch=batch, q_len=q_len, kv_len=prefix + q_len)
    fresh = _capture_chunk(name, batch, prefix, q_len)
    got.lint()
    assert [_cost_view(o) for o in got.ops] == [_cost_view(o) for o in fresh.ops]
    assert sorted((e.src, e.dst, e.kind) for e in got.edges) == sorted((e.src, e.dst, e.kind) for e in fresh.edges)
    # The mask: q x (prefix + q) booleans, each query's own causal row (an independent count of its elements).
    (mask,) = [o for o in got.ops if o.target == "aten.le.Tensor"]
    assert mask.outputs[0].shape == (1, 1, q_len, prefix + q_len)
    attn = [o for o in got.ops if isinstance(o, Attention)]
    assert all(a.inputs[-1].shape == (batch, 1, q_len, prefix + q_len) for a in attn)
    hw, cm, cfg = load_hardware("h100"), resolve_cost_model("roofline"), study_config()
    assert run_study(got, hw, cm, cfg).result.makespan_us == pytest.approx(
        run_study(fresh, hw, cm, cfg).result.makespan_us, rel=1e-9
    )


@pytest.mark.parametrize("name", ["qwen2_sw", "mistral_sw", "gemma3_sw"])
@pytest.mark.parametrize(
    ("prefix", "q_len"),
    [
        (0, 40),  # a prompt shorter than the window: no mask at all
        (0, 48),  # as long as the window: the sliding layers' mask (full layers stay unmasked)
        (0, 60),
        (20, 11),  # over a prefix: the full mask, and the sliding one over every key
        (100, 11),  # the sliding layers' capped cache: window - 1 keys plus the chunk
        (100, 60),
    ],
)
def test_sliding_window_sdpa_layers_build_their_own_mask_as_transformers_does(
    name: str, prefix: int, q_len: int
) -> None:
    # create_sliding_window_causal_mask: its ops outside the layers (the window's sub, gt and the two
    # bitwise_and of and_masks), over the keys each sliding layer reads, and repeat_kv's copies before
    # those layers' SDPA; every op and edge as transformers runs the prompt or chunk.
    template = _template(name, "prefill")
    got = rebatch(template, batch=2, q_len=q_len, kv_len=prefix + q_len)
    fresh = _capture_chunk(name, 2, prefix, q_len) if prefix else _capture(name, "prefill", 2, q_len)
    got.lint()
    assert [_cost_view(o) for o in got.ops] == [_cost_view(o) for o in fresh.ops]
    assert sorted((e.src, e.dst, e.kind) for e in got.edges) == sorted((e.src, e.dst, e.kind) for e in fresh.edges)
    windows = [o.outputs[0].shape for o in got.ops if o.target == "aten.gt.Tensor"]
    sliding = min(prefix + q_len, WINDOW - 1 + q_len)
    assert windows == ([] if prefix == 0 and q_len < WINDOW else [(1, 1, q_len, sliding)])
    masked = [(o.layer, o.inputs[-1].shape) for o in got.ops if isinstance(o, Attention) and len(o.inputs) == 4]
    full = [(1, (2, 1, q_len, prefix + q_len))] if prefix and name != "mistral_sw" else []
    sliding_layers = [(0, (2, 1, q_len, sliding))] if windows else []
    if name == "mistral_sw" and windows:
        sliding_layers.append((1, (2, 1, q_len, sliding)))
    assert sorted(masked) == sorted(sliding_layers + full)


def test_mixed_step_gives_each_part_its_window_mask() -> None:
    pre, dec = _template("qwen2_sw", "prefill"), _template("qwen2_sw", "decode")
    parts = [AttentionPart(1, 8, 100), AttentionPart(1, 50, 50), AttentionPart(1, 6, 6)]
    g = mixed_step(pre, dec, parts, AttentionPart(2, 1, 90))
    g.lint()
    # the chunk over a prefix: full and sliding masks; the prompt as long as the window: the sliding one
    assert [o.outputs[0].shape for o in g.ops if o.target == "aten.gt.Tensor"] == [
        (1, 1, 8, WINDOW - 1 + 8),
        (1, 1, 50, 50),
    ]
    assert [o.outputs[0].shape for o in g.ops if o.target == "aten.le.Tensor"] == [
        (1, 1, 8, 100),
        (1, 1, 8, WINDOW - 1 + 8),
        (1, 1, 50, 50),
    ]
    one = mixed_step(pre, dec, [AttentionPart(1, 50, 50)], None)
    assert [_cost_view(o) for o in one.ops] == [_cost_view(o) for o in rebatch(pre, batch=1, q_len=50).ops]
    # the token-wise base the caller gives is the prefill without masks (each part builds its own)
    tokens = sum(p.batch * p.q_len for p in parts) + 2
    base = rebatch(pre, batch=1, q_len=tokens, masks=False)
    assert mixed_step(pre, dec, parts, AttentionPart(2, 1, 90), base=base).ops == g.ops
    with pytest.raises(RebatchError, match="masks=False"):
        mixed_step(pre, dec, parts, AttentionPart(2, 1, 90), base=rebatch(pre, batch=1, q_len=tokens))


def test_a_prefill_without_a_prefix_and_a_decode_build_no_mask() -> None:
    pre, dec = _template("llama", "prefill"), _template("llama", "decode")
    for g in (rebatch(pre, batch=2, q_len=11), rebatch(dec, batch=2, kv_len=31)):
        assert not [o for o in g.ops if o.target in ("aten.le.Tensor", "aten.clone.default")]
        assert all(len(o.inputs) == 3 for o in g.ops if isinstance(o, Attention))


def test_mixed_step_gives_each_chunk_over_a_prefix_its_own_mask() -> None:
    pre, dec = _template("llama", "prefill"), _template("llama", "decode")
    parts = [AttentionPart(1, 8, 30), AttentionPart(1, 6, 6), AttentionPart(2, 5, 12)]
    g = mixed_step(pre, dec, parts, AttentionPart(3, 1, 20))
    g.lint()
    masks = [o.outputs[0].shape for o in g.ops if o.target == "aten.le.Tensor"]
    assert masks == [(1, 1, 8, 30), (1, 1, 5, 12)]  # the chunks over a prefix; not the whole prompt, nor decodes
    attn = [o for o in g.ops if isinstance(o, Attention) and o.layer == 0]
    assert [len(a.inputs) for a in attn] == [4, 3, 4, 3]
    # One chunk alone is the template rebatched to it, op for op.
    one = mixed_step(pre, dec, [AttentionPart(1, 8, 30)], None)
    assert [_cost_view(o) for o in one.ops] == [_cost_view(o) for o in rebatch(pre, batch=1, q_len=8, kv_len=30).ops]


def test_mixed_step_gives_each_part_the_ops_over_its_keys() -> None:
    # MLA: one kv_b_proj per part, over its batch x keys (the chunk: 1 x 40; the decodes: 3 x 30), each
    # feeding its own part's attention; the token-wise GEMMs run once over the step's 8 + 3 tokens.
    pre, dec = _template("deepseek_v3_long", "prefill"), _template("deepseek_v3_long", "decode")
    g = mixed_step(pre, dec, [AttentionPart(1, 8, 40)], AttentionPart(3, 1, 30))
    g.lint()
    gemms: list[Any] = list(g.ops_of(OpKind.GEMM))
    layers = int(str(CONFIGS["deepseek_v3_long"]["num_hidden_layers"]))
    assert [o.m for o in gemms if o.k == 16] == [40, 90] * layers
    # (k = 1: RoPE's inverse-frequency product, whose rows are rotary dims: transformers 5.17 records it)
    assert {o.m for o in gemms if o.k not in (1, 16) and not o.target.startswith("moe_experts")} == {11}
    ops = {o.id: o for o in g.ops}
    feeds = [(ops[e.src], ops[e.dst]) for e in g.edges if isinstance(ops[e.dst], Attention)]
    up = [(s.m, d.batch * d.kv_len) for s, d in feeds if isinstance(s, Gemm) and s.k == 16]
    assert len(up) == 2 * layers and all(m == keys for m, keys in up)
    # Sliding windows: the chunk's sliding layer reads window - 1 + 8 keys, the decodes' the window.
    pre, dec = _template("gpt_oss_w48", "prefill"), _template("gpt_oss_w48", "decode")
    g = mixed_step(pre, dec, [AttentionPart(1, 8, 100)], AttentionPart(2, 1, 90))
    g.lint()
    assert _attention_kv(g) == [
        (0, 1, WINDOW - 1 + 8, WINDOW),
        (0, 2, WINDOW, WINDOW),
        (1, 1, 100, None),
        (1, 2, 90, None),
    ]
    # Eager attention: each part reads a mask built over its own queries and keys, per window, not one
    # over the step's 10 tokens; each mask feeds its own part's attention.
    wheres = [o for o in g.ops if o.target == "aten.where.self"]
    assert [o.outputs[0].shape for o in wheres] == [(1, 1, 8, 100), (2, 1, 1, 90), (1, 1, 8, 55), (2, 1, 1, WINDOW)]
    reads = {(e.src, e.dst) for e in g.edges}
    for w in wheres:
        (att,) = [o for o in g.ops if isinstance(o, Attention) and (w.id, o.id) in reads]
        assert att.inputs[2].shape == w.outputs[0].shape
    one = mixed_step(pre, dec, [AttentionPart(1, 8, 100)], None)
    assert [_cost_view(o) for o in one.ops] == [_cost_view(o) for o in rebatch(pre, batch=1, q_len=8, kv_len=100).ops]


def _layer_ops(g: OpGraph, layer: int) -> list[dict[str, Any]]:
    return [_cost_view(o) for o in g.ops if o.layer == layer]


@pytest.mark.parametrize("like", [False, True])
def test_window_keys_reach_the_sliding_layers_and_the_full_layers_keep_the_mean(like: bool) -> None:
    # Three decodes over a mean of 200 keys whose lengths capped at the window (48) average 30: the
    # sliding layer's attention and cache ops are transformers' over a cache of 29 tokens (30 keys),
    # the full layer's over 199 (200 keys). ``like`` lends the ops that do not depend on the keys.
    t = _template("gpt_oss_w48", "decode")
    lent = rebatch(t, batch=3, kv_len=60) if like else None
    got = rebatch(t, batch=3, kv_len=200, window_kv={WINDOW: 30}, like=lent)
    assert _attention_kv(got) == [(0, 3, 30, WINDOW), (1, 3, 200, None)]
    assert _layer_ops(got, 0) == _layer_ops(_capture("gpt_oss_w48", "decode", 3, 29), 0)
    assert _layer_ops(got, 1) == _layer_ops(_capture("gpt_oss_w48", "decode", 3, 199), 1)
    # The caches (batch 3, 2 KV heads, keys, head_dim 16), K and V, and the masks built outside the layers.
    cats = {
        layer: [o.outputs[0].shape for o in got.ops if o.layer == layer and o.target == "aten.cat.default"]
        for layer in (0, 1)
    }
    assert cats == {0: [(3, 2, 30, 16)] * 2, 1: [(3, 2, 200, 16)] * 2}
    assert sorted(o.outputs[0].shape for o in got.ops if o.layer is None and o.target == "aten.where.self") == [
        (3, 1, 1, 30),
        (3, 1, 1, 200),
    ]


def test_mixed_step_gives_the_decodes_sliding_layers_their_window_keys() -> None:
    # A chunk of 8 over 100 keys and two decodes over a mean of 90 whose capped lengths average 30:
    # layer by layer, the sliding layer is that of a step whose decodes read 30 keys, the full layer
    # that of one whose decodes read 90. The chunk reads window - 1 + 8 keys either way.
    pre, dec = _template("gpt_oss_w48", "prefill"), _template("gpt_oss_w48", "decode")
    chunk = [AttentionPart(1, 8, 100)]
    got = mixed_step(pre, dec, chunk, AttentionPart(2, 1, 90), decode_window_kv={WINDOW: 30})
    got.lint()
    assert _attention_kv(got) == [
        (0, 1, WINDOW - 1 + 8, WINDOW),
        (0, 2, 30, WINDOW),
        (1, 1, 100, None),
        (1, 2, 90, None),
    ]
    assert _layer_ops(got, 0) == _layer_ops(mixed_step(pre, dec, chunk, AttentionPart(2, 1, 30)), 0)
    assert _layer_ops(got, 1) == _layer_ops(mixed_step(pre, dec, chunk, AttentionPart(2, 1, 90)), 1)
    with pytest.raises(RebatchError, match="without decodes"):
        mixed_step(pre, dec, chunk, None, decode_window_kv={WINDOW: 30})


def test_window_keys_are_checked_against_the_windows_and_keys_of_the_target() -> None:
    t = _template("gpt_oss_w48", "decode")
    assert template_windows(t) == template_windows(_template("gpt_oss_w48", "prefill")) == (WINDOW,)
    assert template_windows(_template("llama", "decode")) == ()
    with pytest.raises(RebatchError, match="not a sliding window"):
        rebatch(t, batch=2, kv_len=100, window_kv={64: 30})
    with pytest.raises(RebatchError, match="outside"):  # more than the window
        rebatch(t, batch=2, kv_len=100, window_kv={WINDOW: WINDOW + 1})
    with pytest.raises(RebatchError, match="outside"):  # more than the mean
        rebatch(t, batch=2, kv_len=20, window_kv={WINDOW: 25})
    with pytest.raises(RebatchError, match="not a sliding window"):
        rebatch(_template("llama", "decode"), batch=2, kv_len=100, window_kv={WINDOW: 30})


def test_like_rebatch_of_an_mla_decode_rewrites_the_latent_up_projection() -> None:
    # The up-projection's rows are batch x cache (a product of two template sizes): they depend on kv_len.
    t = _template("deepseek_v3", "decode")
    like = rebatch(t, batch=3, kv_len=9)
    full, got = rebatch(t, batch=3, kv_len=25), rebatch(t, batch=3, kv_len=25, like=like)
    assert [_cost_view(o) for o in got.ops] == [_cost_view(o) for o in full.ops]
    assert {o.m for o in got.ops_of(OpKind.GEMM) if o.k == 16} == {3 * 25}  # type: ignore[attr-defined]
