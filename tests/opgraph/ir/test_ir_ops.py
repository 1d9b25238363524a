"""Ops: derived FLOPs/bytes/definitions, validation rules, the discriminated union."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_strategies import ops_for
from pydantic import ValidationError

from opgraph.ir import (
    OP_TYPES,
    Attention,
    AttentionVariant,
    Collective,
    CollectiveKind,
    DType,
    Gemm,
    Memory,
    MoeRouting,
    Norm,
    NormVariant,
    OpKind,
    TensorSpec,
    attended_pairs,
    collective_definition,
    parse_op,
)


def test_gemm_derivations() -> None:
    g = Gemm(id=0, m=2048, n=4096, k=4096)
    assert g.flops == 2 * 2048 * 4096 * 4096
    assert g.bytes_read == (2048 * 4096 + 4096 * 4096) * 2
    assert g.bytes_written == 2048 * 4096 * 2
    assert g.definition == "gemm_n4096_k4096"
    assert Gemm(id=0, m=1, n=8, k=8, groups=4).definition == "grouped_gemm_e4_n8_k8"
    assert Gemm(id=0, m=1, n=8, k=8, batch=3).definition == "bmm_b3_n8_k8"


def test_given_values_win_over_derived() -> None:
    g = Gemm(id=0, m=2, n=2, k=2, flops=7, bytes_read=1, bytes_written=2, definition="custom")
    assert (g.flops, g.bytes_read, g.bytes_written, g.definition) == (7, 1, 2, "custom")


def test_bytes_from_tensors_when_present() -> None:
    t = TensorSpec(shape=(4, 8), dtype=DType.fp32)
    m = Memory(id=1, fn="copy", numel=32, inputs=(t,), outputs=(t,))
    assert (m.bytes_read, m.bytes_written) == (128, 128)


def test_masked_moe_routing_adds_the_mask_pass_to_its_field_bytes() -> None:
    fields = {"tokens": 4, "experts": 8, "top_k": 2, "hidden": 16}
    rows = 4 * 2 * 16 * 2  # the S = 8 gathered bf16 rows
    assert MoeRouting(id=0, fn="dispatch", **fields).field_bytes() == (rows, rows)
    assert MoeRouting(id=0, fn="combine", **fields).field_bytes() == (rows, rows)
    # dispatch: ge reads the int64 ids, writes the bool mask; clamp_ reads and writes the ids;
    # masked_fill_ reads the rows and mask, writes the rows.
    assert MoeRouting(id=0, fn="dispatch", masked=True, **fields).field_bytes() == (2 * rows + 8 * 17, 2 * rows + 8 * 9)
    assert MoeRouting(id=0, fn="combine", masked=True, **fields).field_bytes() == (2 * rows + 8, 2 * rows)
    masked = MoeRouting(id=0, fn="combine", masked=True, **fields)
    assert (masked.flops, masked.definition) == (MoeRouting(id=0, fn="combine", **fields).flops, "moe_combine_e8_topk2")
    # Graphs written before the field load unmasked.
    assert MoeRouting.model_validate({"id": 0, "fn": "dispatch", **fields}).masked is False


def test_attention_definitions() -> None:
    pre = Attention(id=0, batch=1, q_len=2048, kv_len=2048, heads=32, kv_heads=8, head_dim=128)
    assert pre.definition == "gqa_ragged_prefill_causal_h32_kv8_d128"
    dec = Attention(id=0, batch=8, q_len=1, kv_len=2048, heads=32, kv_heads=8, head_dim=128)
    assert dec.definition == "gqa_paged_decode_h32_kv8_d128"
    mla = Attention(
        id=0,
        batch=1,
        q_len=16,
        kv_len=16,
        heads=128,
        kv_heads=128,
        head_dim=192,
        head_dim_v=128,
        variant=AttentionVariant.MLA,
    )
    assert mla.definition == "mla_ragged_prefill_causal_h128_kv128_d192_dv128"
    # Causal prefill computes about half of the full square (plus the diagonal).
    full = 2 * 32 * 2048 * 2048 * 256
    assert pre.flops == full // 2 + 2 * 32 * 2048 * 256 // 2


def test_norm_definitions() -> None:
    assert Norm(id=0, rows=4, hidden=4096).definition == "rmsnorm_h4096"
    assert Norm(id=0, rows=4, hidden=1024, variant=NormVariant.LAYER).definition == "layernorm_h1024"


def test_collective_definitions() -> None:
    op = Collective(id=0, collective=CollectiveKind.ALL_GATHER, bytes=65536, group_size=4)
    assert op.definition == "all_gather_g4_b65536"
    assert collective_definition(CollectiveKind.ALL_GATHER, 4, 65536) == op.definition


def test_attention_rejects_bad_heads() -> None:
    with pytest.raises(ValidationError, match="multiple of kv_heads"):
        Attention(id=0, batch=1, q_len=1, kv_len=1, heads=6, kv_heads=4, head_dim=64)
    with pytest.raises(ValidationError, match="exceeds kv_len"):
        Attention(id=0, batch=1, q_len=5, kv_len=4, heads=4, kv_heads=4, head_dim=64)


def test_ops_are_frozen_and_strict() -> None:
    g = Gemm(id=0, m=1, n=1, k=1)
    with pytest.raises(ValidationError):
        g.m = 3  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        Gemm(id=0, m=1, n=1, k=1, bogus=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Gemm(id=-1, m=1, n=1, k=1)


def test_every_kind_has_a_model() -> None:
    assert set(OP_TYPES) == set(OpKind)
    for kind, cls in OP_TYPES.items():
        assert cls.model_fields["kind"].default is kind


@given(st.integers(1, 300), st.integers(0, 300), st.booleans(), st.none() | st.integers(1, 400))
def test_attended_pairs_matches_brute_force(q_len: int, extra: int, causal: bool, window: int | None) -> None:
    kv_len = q_len + extra
    brute = 0
    for i in range(q_len):
        pos = kv_len - q_len + i
        seen = pos + 1 if causal else kv_len
        brute += seen if window is None else min(seen, window)
    assert attended_pairs(q_len, kv_len, causal, window) == brute


@settings(max_examples=60)
@given(st.integers(0, 50).flatmap(ops_for))
def test_op_json_round_trip(op: object) -> None:
    from opgraph.ir import OpBase

    assert isinstance(op, OpBase)
    again = parse_op(op.model_dump(mode="json"))
    assert again == op
    assert type(again) is type(op)
    assert op.flops >= 0 and op.bytes_read >= 0 and op.bytes_written >= 0 and op.definition
