"""``Rope`` ops take their heads and rotated dims from the tensors they rotate, not from the attention:
MLA's one-head rope key and partial query, partial rotary (Phi, GPT-NeoX), and Llama unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from hardware.models.profile import profile_features
from opgraph.capture import capture
from opgraph.ir import OpGraph, OpKind, Rope
from tests.opgraph.capture.test_capture_architectures import BASE, tiny_config

SEQ = 8


def ropes(g: OpGraph) -> list[tuple[str, int, int, int, int | None, int]]:
    """(definition, tokens, heads, head_dim, rotary_dim, flops) of the first layer's ropes."""
    out = []
    for o in g.ops_of(OpKind.ROPE):
        assert isinstance(o, Rope)
        if o.layer == 0:
            out.append((o.definition, o.tokens, o.heads, o.head_dim, o.rotary_dim, o.flops))
    return sorted(out)


def write_config(tmp_path: Path, model_type: str, arch: str, extra: dict[str, Any]) -> str:
    """A tiny config of ``model_type`` on the shared sizes (4 heads, 2 KV heads, head_dim 16)."""
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps({**BASE, **extra, "model_type": model_type, "architectures": [arch]}))
    return str(path)


def test_llama_rope_unchanged(tmp_path: Path) -> None:
    g = capture(tiny_config(tmp_path, "llama"), seq_len=SEQ)
    assert ropes(g) == [
        ("rope_h2_d16", SEQ, 2, 16, None, 3 * SEQ * 2 * 16),
        ("rope_h4_d16", SEQ, 4, 16, None, 3 * SEQ * 4 * 16),
    ]


@pytest.mark.parametrize(("phase", "tokens"), [("prefill", SEQ), ("decode", 1)])
def test_mla_rope_key_is_one_head_and_query_rotates_its_rope_part(tmp_path: Path, phase: str, tokens: int) -> None:
    # The tiny DeepSeek-V3: 4 heads of qk_nope 16 + qk_rope 8 = 24; the rope key is shared by the heads.
    g = capture(tiny_config(tmp_path, "deepseek_v3"), seq_len=SEQ, kv_len=SEQ, phase=phase)
    assert ropes(g) == [
        ("rope_h1_d8", tokens, 1, 8, None, 3 * tokens * 1 * 8),
        ("rope_h4_d24_r8", tokens, 4, 24, 8, 3 * tokens * 4 * 8),  # named apart from a whole-head rope
    ]


@pytest.mark.parametrize(("phase", "cached"), [("prefill", 0), ("decode", SEQ)])
def test_mla_rope_keys_cache_append_is_an_op_of_its_own(tmp_path: Path, phase: str, cached: int) -> None:
    # DynamicCache appends the rotated rope key to the cached ones (a cat over the tokens): a memory op
    # over every cached key plus the new, as the latent's append beside it, not a part of the rope.
    g = capture(tiny_config(tmp_path, "deepseek_v3"), seq_len=SEQ, kv_len=SEQ, phase=phase)
    tokens = SEQ if phase == "prefill" else 1
    appends = [o for o in g.ops if o.layer == 0 and o.kind is OpKind.MEMORY and o.target == "aten.cat.default"]
    assert sorted(o.outputs[0].shape[-2:] for o in appends) == [(cached + tokens, 8), (cached + tokens, 16)]
    (key,) = [o for o in g.ops_of(OpKind.ROPE) if o.layer == 0 and o.heads == 1]
    assert key.outputs[0].shape[-2:] == (tokens, 8)  # the new tokens' rotation only
    rope_key = next(a for a in appends if a.outputs[0].shape[-1] == 8)
    assert (key.id, rope_key.id) in {(e.src, e.dst) for e in g.edges}


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_mla_keys_put_together_by_copies_are_copies_not_cache_writes(tmp_path: Path, phase: str) -> None:
    # transformers' expand_kv: the keys are a new_empty tensor, each head's no-rope part copied into one
    # slice of it and the one rotated rope key, broadcast over the heads, into the other. The cache holds
    # the latents (appended by cat); these copies write no cache and are priced as the copies they are.
    g = capture(tiny_config(tmp_path, "deepseek_v3"), seq_len=SEQ, kv_len=SEQ, phase=phase)
    mem = [o for o in g.ops if o.layer == 0 and o.kind is OpKind.MEMORY]
    assert [o.fn for o in mem if o.fn == "kv_cache_write"] == []
    copies = {o.outputs[0].shape[-1]: o for o in mem if o.target == "aten.copy_.default"}
    assert sorted(copies) == [8, 16] and all(o.fn == "copy" for o in copies.values())
    dst, src = copies[8].inputs
    assert dst.strides is not None and dst.strides[-2] == 24  # a slice of the [.., nope 16 + rope 8] keys
    assert src.strides is not None and src.strides[1] == 0  # the rope key's one head over every head
    assert profile_features(copies[8]).regime == "memory:copy:broadcast"
    assert profile_features(copies[16]).regime == "memory:copy:strided"  # out of the transposed projection
    (key,) = [o for o in g.ops_of(OpKind.ROPE) if o.layer == 0 and o.heads == 1]
    assert key.outputs[0].shape[-1] == 8  # the rotation is still found through the copy


@pytest.mark.parametrize(
    ("model_type", "arch", "extra", "rotary_dim"),
    [
        ("phi", "PhiForCausalLM", {"partial_rotary_factor": 0.5}, 8),
        ("gpt_neox", "GPTNeoXForCausalLM", {"rotary_pct": 0.25}, 4),
    ],
)
def test_partial_rotary_sets_rotary_dim(
    tmp_path: Path, model_type: str, arch: str, extra: dict[str, Any], rotary_dim: int
) -> None:
    g = capture(write_config(tmp_path, model_type, arch, extra), seq_len=SEQ)
    got = ropes(g)
    assert got and all(r[3] == 16 and r[4] == rotary_dim for r in got), got
    assert all(r[0] == f"rope_h{r[2]}_d16_r{rotary_dim}" for r in got), got
    assert all(r[5] == 3 * SEQ * r[2] * rotary_dim for r in got), got


def test_eager_querys_layout_copy_is_an_op_of_its_own_after_the_ropes(tmp_path: Path) -> None:
    """Eager attention's ``matmul`` makes the rotated query (a transposed view) contiguous first: a copy of
    its own, not part of the query's rope, and the ropes keep the order they run in (query, then key), as
    SDPA's capture has them; the ropes are those SDPA's capture has. (One sequence's transposed query is a
    view of the batched matrices matmul needs; two are not.)"""
    config = tiny_config(tmp_path, "llama")
    sdpa = capture(config, seq_len=SEQ, batch=2)
    eager = capture(config, seq_len=SEQ, batch=2, attn_impl="eager")
    assert ropes(eager) == ropes(sdpa)
    layer = [o for o in eager.ops if o.layer == 0 and o.scope.endswith("self_attn")]
    kinds = [o.kind for o in layer]
    rope_q, rope_k = (o for o in layer if o.kind is OpKind.ROPE)
    assert (rope_q.heads, rope_k.heads) == (4, 2)
    attention = kinds.index(OpKind.ATTENTION)
    copy = layer[attention - 1]
    assert copy.kind is OpKind.MEMORY and copy.target == "aten.clone.default"
    (src,) = copy.inputs
    assert src.shape == (2, 4, SEQ, 16) and src.strides is not None  # the rotated query, transposed
    assert copy.bytes_written == 2 * SEQ * 4 * 16 * 2
    # the SDPA capture has no such copy: SDPA reads the strided query
    assert not any(
        o.kind is OpKind.MEMORY and o.inputs and o.inputs[0].shape == (2, 4, SEQ, 16) for o in sdpa.ops if o.layer == 0
    )
