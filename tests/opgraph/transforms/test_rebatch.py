"""Rebatching a captured graph equals a fresh capture at the target shape, op for op."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from opgraph.ir import OpGraph, OpKind
from opgraph.ir.ops import Attention
from opgraph.transforms import (
    TEMPLATE_DECODE,
    TEMPLATE_PREFILL,
    AttentionPart,
    RebatchError,
    mixed_step,
    rebatch,
)
from tests.conftest import TINY_LLAMA

TINY_MOE: dict[str, object] = {
    **TINY_LLAMA,
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}
CONFIGS = {"llama": TINY_LLAMA, "moe": TINY_MOE}


@cache
def _config_path(name: str) -> str:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=f"rebatch_{name}_"))
    path = folder / "config.json"
    path.write_text(json.dumps(CONFIGS[name]))
    return str(path)


@cache
def _capture(name: str, phase: str, batch: int, size: int) -> OpGraph:
    from opgraph.capture import capture

    if phase == "prefill":
        return capture(_config_path(name), phase="prefill", batch=batch, seq_len=size)
    return capture(_config_path(name), phase="decode", batch=batch, kv_len=size)


def _template(name: str, phase: str) -> OpGraph:
    t = TEMPLATE_PREFILL if phase == "prefill" else TEMPLATE_DECODE
    return _capture(name, phase, t["batch"], t["seq_len"] if phase == "prefill" else t["kv_len"])


def _cost_view(op: Any) -> dict[str, Any]:
    skip = {"id", "target", "scope", "call", "inputs", "outputs", "host_gap_us", "stage", "step"}
    fields = {k: v for k, v in op.__dict__.items() if k not in skip}
    fields["outputs"] = [t.shape for t in op.outputs]
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
