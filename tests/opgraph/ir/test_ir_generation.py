"""Generation plans: steps built from a template, lazily, with costs from the op models."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from opgraph.ir import OpGraph
from opgraph.ir.errors import DanglingEdgeError
from opgraph.ir.generation import EdgeTemplate, FieldDelta, GenerationPlan, Rederived
from opgraph.ir.graph import Edge
from opgraph.ir.ops import Attention, Elementwise, Stage, TopK
from opgraph.ir.tensor import TensorSpec


def _attn(op_id: int, step: int, kv_len: int, tid: int) -> Attention:
    kv = TensorSpec(shape=(1, 2, kv_len, 16), dtype="bf16", id=tid)
    return Attention(
        id=op_id, step=step, stage=Stage.DECODE, batch=1, q_len=1, kv_len=kv_len, heads=4, kv_heads=2,
        head_dim=16, inputs=(TensorSpec(shape=(1, 4, 1, 16), dtype="bf16", id=0), kv),
        outputs=(TensorSpec(shape=(1, 4, 1, 16), dtype="bf16", id=tid + 1),),
    )  # fmt: skip


def _sampler(op_id: int, step: int, tid: int) -> TopK:
    return TopK(id=op_id, step=step, stage=Stage.DECODE, fn="argmax", rows=1, cols=8, scope="sampler",
                inputs=(TensorSpec(shape=(1, 8), dtype="bf16", id=tid),))  # fmt: skip


def _recorded(steps: int) -> tuple[list[object], list[Edge]]:
    """Steps 0..steps of a toy generation: per decode step an attention over a KV cache one token
    longer, then a sampler; the attention reads the previous step's output (tensor ids 10 per step)."""
    ops: list[object] = [Elementwise(id=0, step=0, stage=Stage.PREFILL, fn="add", numel=4)]
    edges: list[Edge] = []
    for s in range(1, steps + 1):
        a = _attn(2 * s - 1, s, 8 + s, 10 * s)
        ops.append(a)
        edges.append(Edge(src=2 * s - 2, dst=2 * s - 1))
        if s < steps:
            ops.append(_sampler(2 * s, s, 10 * s + 1))
            edges.append(Edge(src=2 * s - 1, dst=2 * s, tensor=10 * s + 1))
    return ops, edges


def _plan(last: int) -> GenerationPlan:
    return GenerationPlan(
        base_step=2, first_step=3, last_step=last, ops=(_attn(3, 2, 10, 20), _sampler(4, 2, 21)),
        edges=(EdgeTemplate(src=2, dst=3), EdgeTemplate(src=3, dst=4, tensor=21)),
        op_shift=2, op_floor=1, tensor_shift=10, tensor_floor=10,
        deltas=(
            FieldDelta(op=0, path=("kv_len",), per_step=1), FieldDelta(op=0, path=("inputs", 1, "shape", 2), per_step=1)
        ),
        rederived=(Rederived(op=0, fields=("flops", "bytes_read", "bytes_written", "definition")),),
        final_drop=(1,),
    )  # fmt: skip


def _planned(last: int) -> OpGraph:
    ops, edges = _recorded(2)
    # Steps 0..2 are recorded; step 2 keeps its sampler (its next step exists).
    ops.append(_sampler(4, 2, 21))
    edges.append(Edge(src=3, dst=4, tensor=21))
    return OpGraph(ops=ops, edges=edges, generation=_plan(last))


def test_planned_steps_equal_the_ops_written_out() -> None:
    g = _planned(6)
    full_ops, full_edges = _recorded(6)
    assert g.schema_version == 2
    assert list(g.ops) == full_ops
    assert list(g.edges) == full_edges
    assert len(g) == len(full_ops) and g.ops[-1] == full_ops[-1] and g.ops[-3:] == full_ops[-3:]
    assert g.op(11) == full_ops[11]
    # The attention's cost at step 6 is its model's at kv_len 14, not the template's.
    assert g.ops[11].flops == _attn(11, 6, 14, 60).flops > g.generation.ops[0].flops  # type: ignore[union-attr]
    with pytest.raises(KeyError):
        g.op(12)
    g.lint()


@pytest.mark.parametrize("view", ["ops", "edges"])
def test_lazy_views_index_like_the_lists_written_out(view: str) -> None:
    # Every index and slice of a lazy view, recorded part and planned part, reads as the full list does.
    full = dict(zip(("ops", "edges"), _recorded(6), strict=True))[view]
    lazy = getattr(_planned(6), view)
    assert [lazy[i] for i in range(-len(full), len(full))] == [full[i] for i in range(-len(full), len(full))]
    assert lazy[1:-1:3] == full[1:-1:3] and lazy[::-2] == full[::-2]
    for bad in (len(full), -len(full) - 1):
        with pytest.raises(IndexError, match=f"^{view[:-1]} index out of range$"):
            lazy[bad]


def test_planned_graph_round_trips_compactly() -> None:
    g = _planned(40)
    text = g.model_dump_json()
    again = OpGraph.model_validate_json(text)
    assert again == g and list(again.ops) == list(g.ops)
    assert len(text) < len(OpGraph(ops=tuple(g.ops), edges=tuple(g.edges)).model_dump_json()) / 5


def test_summary_counts_planned_steps_without_building_them() -> None:
    g = _planned(7)
    full_ops, full_edges = _recorded(7)
    assert g.summary() == OpGraph(ops=full_ops, edges=full_edges).summary()


def test_new_ops_replace_the_plan() -> None:
    g = _planned(5)
    copy = g.model_copy(update={"ops": tuple(g.ops)[:3]})
    assert copy.generation is None and copy.schema_version == 1 and len(copy.ops) == 3
    assert len(copy.edges) == len(g.edges)
    meta_only = g.model_copy(update={"metadata": g.metadata.model_copy(update={"model": "x"})})
    assert meta_only.generation == g.generation and list(meta_only.ops) == list(g.ops)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"final_drop": (0,)}, "final_drop must be the template's last ops"),
        ({"edges": (EdgeTemplate(src=4, dst=3),)}, "does not go forward"),
        ({"first_step": 4}, "must follow base_step"),
        ({"op_shift": 3}, "must equal the template's op count"),
        ({"deltas": (FieldDelta(op=5, path=("kv_len",), per_step=1),)}, "outside the template"),
    ],
)
def test_bad_plans_are_refused(change: dict[str, object], message: str) -> None:
    data = _plan(5).model_dump()
    data.update(change)
    with pytest.raises(ValidationError, match=message):
        GenerationPlan.model_validate(data)


def test_lint_finds_a_template_that_is_not_the_last_recorded_step() -> None:
    ops, edges = _recorded(1)  # step 2 missing: the plan's template ids are not recorded
    g = OpGraph(ops=ops, edges=edges, generation=_plan(5))
    with pytest.raises(DanglingEdgeError, match="not the last recorded step"):
        g.lint()


def test_window_builds_consecutive_steps_alone() -> None:
    g = _planned(6)
    full_ops, _ = _recorded(6)
    ops, edges = g.generation.window(4, 6)  # type: ignore[union-attr]
    assert ops == full_ops[7:]
    # The edge into step 4 from step 3 (outside the window) is left out; the others are kept.
    assert [(s, d) for s, d, _, _ in edges] == [(7, 8), (8, 9), (9, 10), (10, 11)]
    earlier, _ = g.generation.window(1, 1)  # type: ignore[union-attr]
    assert earlier == full_ops[1:3]


def test_a_graph_without_a_plan_is_saved_as_before() -> None:
    # Older opgraphs refuse unknown fields: a plain graph must not gain a "generation": null.
    full_ops, full_edges = _recorded(3)
    raw = json.loads(OpGraph(ops=full_ops, edges=full_edges).model_dump_json())
    assert raw["schema_version"] == 1 and "generation" not in raw
    assert set(raw) == {"schema_version", "metadata", "ops", "edges"}
