"""Eager attention is priced kernel by kernel: the scores' batched matmul, each pass over the scores, the
values' batched matmul (``opgraph.ir.eager_parts``, ``hardware.base.estimate_op``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hardware import load_hardware, resolve_cost_model
from hardware.base import UncostedOpError, eager_attention_cost, estimate_op
from opgraph.ir import Attention, DType, EagerPass, Gemm, OpKind, Softmax, eager_parts, parse_op
from opgraph.ir.configs import config_key
from simulators.costing import FixedCostModel

REPO = Path(__file__).resolve().parents[2]

PASSES = (
    EagerPass(kind=OpKind.ELEMENTWISE, fn="mul", read=2, written=2),
    EagerPass(kind=OpKind.MEMORY, fn="cat", read=2, written=2, read_row=2, written_row=2),
    EagerPass(kind=OpKind.SOFTMAX, fn="_softmax", read=2, written=4, dtype=DType.fp32),
    EagerPass(kind=OpKind.MEMORY, fn="cast", read=4, written=2),
)


def eager(batch: int = 2, q_len: int = 4, kv_len: int = 8) -> Attention:
    return Attention(id=3, batch=batch, q_len=q_len, kv_len=kv_len, heads=4, kv_heads=2, head_dim=16, eager=PASSES)


def test_the_parts_follow_the_attention_shape() -> None:
    for b, q, kv in ((2, 4, 8), (5, 1, 33)):
        parts = eager_parts(eager(b, q, kv))
        bh, rows, scores = b * 4, b * 4 * q, b * 4 * q * kv
        first, last = parts[0], parts[-1]
        assert isinstance(first, Gemm) and (first.batch, first.m, first.n, first.k) == (bh, q, kv, 16)
        assert isinstance(last, Gemm) and (last.batch, last.m, last.n, last.k) == (bh, q, 16, kv)
        assert [p.kind for p in parts[1:-1]] == [p.kind for p in PASSES]
        cat, softmax = parts[2], parts[3]
        assert (cat.bytes_read, cat.bytes_written) == (2 * scores + 2 * rows, 2 * scores + 2 * rows)
        assert isinstance(softmax, Softmax) and (softmax.rows, softmax.cols) == (rows, kv)
        assert softmax.dtype is DType.fp32 and softmax.bytes_written == 4 * scores
        assert all(p.id == 3 for p in parts)
    assert eager_parts(eager().model_copy(update={"eager": None})) == ()


def test_eager_attention_costs_the_sum_of_its_kernels() -> None:
    hw = load_hardware("h100")
    times = {OpKind.GEMM: 10.0, OpKind.ELEMENTWISE: 1.0, OpKind.SOFTMAX: 3.0, OpKind.MEMORY: 2.0, OpKind.ATTENTION: 7.0}
    model = FixedCostModel(by_kind=times)
    cost = eager_attention_cost(model, eager(), hw)
    assert cost is not None and cost.us == pytest.approx(10 + 1 + 2 + 3 + 2 + 10)
    assert cost.detail.startswith("eager attention, 6 kernels: bmm_b8_n8_k16 10.0 us, mul_scalar_h8 1.0 us")
    assert eager_attention_cost(model, eager().model_copy(update={"eager": None}), hw) is None
    # the models that price ops from their fields price it so; the profile lists its kernels' points
    for spec in ("roofline", "h100-sxm.profile.json"):
        priced = resolve_cost_model(spec if spec == "roofline" else str(REPO / "hardware" / "catalog" / spec))
        sums = estimate_op(priced, eager(), hw, spec)
        assert not isinstance(sums, str) and sums.detail.startswith("eager attention, 6 kernels")
    # a kernel the model cannot price leaves the whole op uncosted, with the model's reason
    with pytest.raises(UncostedOpError, match="elementwise"):
        eager_attention_cost(FixedCostModel(by_kind={OpKind.GEMM: 1.0}), eager(), hw)


def test_a_table_that_measured_the_eager_op_itself_answers_from_its_measurement(tmp_path: Path) -> None:
    # `opgraph validate` replays eager attention as its kernels and calibrates a table on the whole op:
    # that measurement prices it; a table without it asks its fallback, which sums the kernels.
    from hardware.models.table import CostTable, TableEntry, TableModel

    hw = load_hardware("h100")
    op = eager()
    table = CostTable(entries=(TableEntry.from_op(op, 123e-6),))
    measured = estimate_op(TableModel(table), op, hw, "table")
    assert not isinstance(measured, str) and measured.us == pytest.approx(123.0)
    other = CostTable(entries=(TableEntry.from_op(Gemm(id=0, m=1, n=1, k=1), 1e-6),))
    summed = estimate_op(TableModel(other), op, hw, "table")
    assert not isinstance(summed, str) and "eager attention, 6 kernels" in summed.detail


def test_materialised_scores_make_eager_attention_slower_than_the_fused_kernel() -> None:
    hw = load_hardware("h100")
    roofline = resolve_cost_model("roofline")
    long = eager(1, 2048, 2048)
    slow = estimate_op(roofline, long, hw, "roofline")
    fast = estimate_op(roofline, long.model_copy(update={"eager": None}), hw, "roofline")
    assert not isinstance(slow, str) and not isinstance(fast, str)
    assert slow.us > 2 * fast.us
    assert slow.memory_s > fast.memory_s  # the scores are written and read by every pass


def test_a_fused_attention_keeps_the_key_the_shipped_profiles_measured_it_under() -> None:
    # ``eager`` came after the profiles: unset, it is left out of the key (the catalog's points stay found).
    points = json.loads((REPO / "hardware" / "catalog" / "h100-sxm.profile.json").read_text())["points"]
    ops = [(parse_op(p["op"]), p["key"]) for p in points if p["op"]["kind"] == "attention" and not p["tag"]]
    assert len(ops) > 100
    # one point keeps the key of the name the IR gave its op before e34a7ae (tests/validators/test_profile_sweep)
    assert {key for op, key in ops if config_key(op) != key} <= {"e420cff6ded17314"}


def test_rows_widened_by_a_sink_column_are_priced_as_the_kernels_run_them() -> None:
    """gpt-oss: from the sinks ``cat`` on, rows hold ``kv_len + 1`` columns, not 16-byte aligned (the cat
    1.6 ms a layer where aligned rows took 0.36, the softmax 1.5 against 0.6), and the values' matmul reads
    the weights with the sink column sliced off, rows ``kv_len + 1`` apart (0.44 ms against 0.20)."""
    from hardware.models.profile import profile_features

    sinks = (
        EagerPass(kind=OpKind.MEMORY, fn="cat", read=2, written=2, read_row=2, written_row=2, extra_cols=1),
        EagerPass(kind=OpKind.SOFTMAX, fn="_softmax", read=2, written=2, read_row=2, written_row=2, extra_cols=1),
    )
    att = Attention(id=0, batch=1, q_len=2048, kv_len=2048, heads=64, kv_heads=8, head_dim=64, eager=sinks)
    scores, cat, softmax, values = eager_parts(att)
    assert cat.outputs[0].shape == (1, 64, 2048, 2049) and isinstance(softmax, Softmax) and softmax.cols == 2049
    regimes = [profile_features(p).regime for p in (scores, cat, softmax, values)]  # type: ignore[union-attr]
    assert regimes == ["gemm:batched", "memory:cat:unaligned", "softmax:masked:unaligned", "gemm:batched:unaligned"]
    assert isinstance(values, Gemm) and values.inputs[0].strides == (2048 * 2049, 2049, 1)
    # the parts' bytes are the passes' (the sliced operand recorded for its layout, not as the only read)
    plain = eager_parts(att.model_copy(update={"eager": (sinks[0].model_copy(update={"extra_cols": 0}),)}))[-1]
    assert plain.inputs == () and profile_features(plain).regime == "gemm:batched"  # type: ignore[union-attr]
    assert (values.bytes_read, values.bytes_written) == (plain.bytes_read, plain.bytes_written)


def test_a_pass_reading_a_broadcast_operand_is_priced_as_a_strided_kernel() -> None:
    """A mask over the heads, a row maximum over its row, sinks expanded over the queries: each pass reads
    its operand through a stride of 0 (gpt-oss b2 s2048: the mask add 1.5 ms a layer, priced 1.0 from the
    flat points; the sinks cat 3.2 ms, priced 1.4 from a contiguous column's)."""
    from hardware.models.profile import profile_features

    size = 2.0
    mask = EagerPass(kind=OpKind.ELEMENTWISE, fn="add", read=size * (1 + 1 / 64), written=size, broadcast=True)
    cat = EagerPass(kind=OpKind.MEMORY, fn="cat", read=size, written=size, read_row=size, written_row=size,
                    extra_cols=1, broadcast=True)  # fmt: skip
    sub = EagerPass(kind=OpKind.ELEMENTWISE, fn="sub", read=size, written=size, read_row=2 * size,
                    written_row=size, extra_cols=1, broadcast=True)  # fmt: skip
    att = Attention(id=0, batch=2, q_len=16, kv_len=16, heads=64, kv_heads=8, head_dim=64, eager=(mask, cat, sub))
    _, add, sinks, minus, _ = eager_parts(att)
    assert add.inputs[1].strides == (16 * 16, 0, 16, 1)  # over the heads
    assert sinks.inputs[1].shape == (2, 64, 16, 1) and sinks.inputs[1].strides == (0, 1, 0, 1)  # over the queries
    assert minus.inputs[1].strides == (64 * 16, 16, 1, 0)  # over the row's columns
    regimes = [profile_features(p).regime for p in (add, sinks, minus)]  # type: ignore[union-attr]
    assert regimes == ["elementwise:add:broadcast", "memory:cat:broadcast", "elementwise:sub:broadcast"]
    flat = eager_parts(att.model_copy(update={"eager": (mask.model_copy(update={"broadcast": False}),)}))[1]
    assert flat.inputs == () and (flat.bytes_read, flat.bytes_written) == (add.bytes_read, add.bytes_written)


def test_a_scale_by_a_number_reads_the_scores_once_and_an_alibi_addend_is_copied_first() -> None:
    """``scores * scaling`` reads one tensor (Qwen2.5 b1 s2048: 159 us a layer, priced 224 as a product of
    two); BLOOM's ``baddbmm(alibi, q, k^T)`` first copies the alibi expanded over the queries into the
    scores (35 us a layer at b1 s1024), then its matmul accumulates onto them (24 us, where a plain bmm ran 14)."""
    from hardware.models.profile import profile_features
    from opgraph.ir import Elementwise, Memory

    alibi = EagerPass(kind=OpKind.MEMORY, fn="addend", read=2 / 8, written=2, broadcast=True, addend=True)
    att = Attention(id=0, batch=2, q_len=8, kv_len=8, heads=4, kv_heads=4, head_dim=16, eager=(alibi, *PASSES))
    addend, scores, scale, *_ = eager_parts(att)
    plain, plain_scale = eager_parts(att.model_copy(update={"eager": PASSES}))[:2]
    n = 2 * 4 * 8 * 8
    assert isinstance(addend, Memory) and isinstance(scores, Gemm) and (scores.m, scores.n) == (8, 8)
    assert addend.inputs[0].strides == (4 * 8, 8, 0, 1) and addend.bytes_written == 2 * n
    assert (scores.bytes_read, scores.bytes_written) == (plain.bytes_read + 2 * n, plain.bytes_written)
    assert [t.shape for t in scores.inputs] == [(8, 8, 16), (8, 16, 8), (8, 8, 8)]  # q, k^T, what it adds onto
    assert profile_features(scores).regime == "gemm:batched:accumulate"  # type: ignore[union-attr]
    assert profile_features(addend).regime == "memory:addend:broadcast"  # type: ignore[union-attr]
    assert isinstance(scale, Elementwise) and scale == plain_scale and scale.scalar
    assert scale.field_bytes() == (2 * n, 2 * n) and profile_features(scale).regime == "elementwise:mul:scalar"  # type: ignore[union-attr]
    two = PASSES[0].model_copy(update={"read": 4})  # a product of two score-sized tensors
    (product,) = eager_parts(att.model_copy(update={"eager": (two,)}))[1:-1]
    assert isinstance(product, Elementwise) and not product.scalar and product.field_bytes() == (4 * n, 2 * n)


def test_a_softmax_of_half_scores_taken_in_float32_is_its_own_kernel() -> None:
    """An fp16 model's ``softmax(x, dtype=float32)`` is one kernel that reads the half scores; past 1024
    columns it is a block per row (Llama-1B fp16 b2 s2048: 1.7 ms a layer, priced 0.7 from float32 input's
    warp kernel). Its part records the half input and float32 output; a bfloat16 model's cast stays apart.
    Over a causal prefill's scores both kernels run longer than over random rows (1.2-1.35x for half input,
    ``benchmarks/gpu/softmax_data_probe.py``): a prefill's softmax is ``masked``, a decode's is not."""
    from hardware.models.profile import profile_features, variant_chain

    half = EagerPass(kind=OpKind.SOFTMAX, fn="_softmax", read=2, written=4, dtype=DType.fp32)
    att = Attention(id=0, batch=1, q_len=8, kv_len=2049, heads=2, kv_heads=2, head_dim=16, dtype=DType.fp16)
    softmax = eager_parts(att.model_copy(update={"eager": (half,)}))[1]
    assert isinstance(softmax, Softmax) and [t.dtype for t in (*softmax.inputs, *softmax.outputs)] == [
        DType.fp16,
        DType.fp32,
    ]
    regime = profile_features(softmax).regime  # type: ignore[union-attr]
    assert regime == "softmax:half_to_float:masked:unaligned"  # a causal prefill's scores: masked rows
    assert variant_chain(regime)[:3] == (regime, "softmax:half_to_float:masked", "softmax:half_to_float:unaligned")
    decode = eager_parts(att.model_copy(update={"eager": (half,), "q_len": 1}))[1]
    assert isinstance(decode, Softmax) and not decode.masked and decode.definition == "softmax_d2049"
    wide = eager_parts(att.model_copy(update={"eager": (half.model_copy(update={"read": 4}),)}))[1]
    assert wide.inputs == () and profile_features(wide).regime == "softmax:masked:unaligned"  # type: ignore[union-attr]
