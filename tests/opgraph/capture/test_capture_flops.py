"""Total FLOPs of Llama-family captures against the analytic count (linear layers, attention, lm_head)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

from opgraph.capture import capture, presets
from opgraph.ir import OpKind, attended_pairs


def analytic_flops(cfg: dict[str, Any], batch: int, q_len: int, kv_cached: int, layers: int | None = None) -> int:
    """2*T*(2d^2 + 2*d*kv*d_h + 3*d*d_ff) per layer (q/o for h*d_h = d), causal attention, lm_head."""
    d = cfg["hidden_size"]
    n_layers = layers or cfg["num_hidden_layers"]
    h = cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"]
    dh = cfg.get("head_dim", d // h)
    ff = cfg["intermediate_size"]
    tokens = batch * q_len
    linear = 2 * tokens * (2 * d * h * dh + 2 * d * kv * dh + 3 * d * ff)
    attention = 2 * batch * h * attended_pairs(q_len, kv_cached + q_len, True) * (2 * dh)
    return int(n_layers * (linear + attention) + 2 * tokens * d * cfg["vocab_size"])


@pytest.mark.parametrize(
    ("preset", "layers"), [("llama-3.2-1b", None), ("llama-3.1-8b", 4), ("vicuna-7b", 2), ("llama-3.1-70b", 2)]
)
def test_prefill_flops_match_analytic(preset: str, layers: int | None) -> None:
    g = capture(preset, seq_len=256, batch=2, layers=layers)
    expected = analytic_flops(presets()[preset].config, 2, 256, 0, layers)
    total = sum(o.flops for o in g.ops)
    assert abs(total / expected - 1) < 0.0005, (total, expected)  # the README claims 0.05%


@pytest.mark.parametrize("preset", ["llama-3.2-1b", "llama-3.1-8b"])
def test_decode_flops_match_analytic(preset: str) -> None:
    g = capture(preset, phase="decode", batch=4, kv_len=300, layers=3)
    expected = analytic_flops(presets()[preset].config, 4, 1, 300, 3)
    total = sum(o.flops for o in g.ops)
    assert abs(total / expected - 1) < 0.0005, (total, expected)  # the README claims 0.05%
    att = g.ops_of(OpKind.ATTENTION)
    assert len(att) == 3 and all(o.kv_len == 301 and o.q_len == 1 for o in att)  # type: ignore[attr-defined]
    assert att[0].definition == "gqa_paged_decode_h32_kv8_d" + str(att[0].head_dim)  # type: ignore[attr-defined]
    assert all(o.stage is not None and o.stage.value == "decode" for o in g.ops)


def test_llama_layer_structure() -> None:
    g = capture("llama-3.1-8b", seq_len=64, layers=2)
    g.lint()
    layer0 = [o for o in g.ops if o.layer == 0]
    gemms = sorted(o.definition for o in layer0 if o.kind is OpKind.GEMM)
    assert gemms == sorted(
        [
            "gemm_n4096_k4096",
            "gemm_n1024_k4096",
            "gemm_n1024_k4096",
            "gemm_n4096_k4096",
            "gemm_n14336_k4096",
            "gemm_n14336_k4096",
            "gemm_n4096_k14336",
        ]
    )
    kinds = {o.kind for o in layer0}
    assert {OpKind.NORM, OpKind.ROPE, OpKind.ATTENTION, OpKind.ACTIVATION, OpKind.MEMORY} <= kinds
    defs = {o.definition for o in layer0}
    assert {
        "rmsnorm_h4096",
        "rope_h32_d128",
        "rope_h8_d128",
        "swiglu_h14336",
        "gqa_ragged_prefill_causal_h32_kv8_d128",
    } <= defs
    assert sum(1 for o in layer0 if o.definition.startswith("kv_cache_write")) == 2
    # Every GEMM lowered from one aten op keeps its call for replay.
    mm = next(o for o in layer0 if o.kind is OpKind.GEMM)
    assert mm.call is not None and mm.call.args[0] == {"tensor": 0}
