"""The gemm replay recipe runs an expert GEMM as its typed ``expert`` field says the model ran it, whatever
its definition says: a renamed ``batched_mm`` GEMM gathers one weight copy per pair from the field's
experts, a renamed grouped GEMM runs the field's implementation, and a GEMM without the field is a plain
batched or grouped GEMM however it is named."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from opgraph.ir import DType, ExpertGemm, ExpertPart, ExpertsImpl, Gemm, TensorSpec  # noqa: E402
from validators.recipes import BuildContext, RecipeSelector  # noqa: E402
from validators.recipes.gemm import is_batched_mm  # noqa: E402

BF16 = DType.bf16


def _ctx() -> BuildContext:
    return BuildContext(torch.device("cpu"), torch.Generator().manual_seed(0))


def _note(op: Gemm) -> str:
    sel = RecipeSelector().select(op)
    assert sel.recipe is not None and sel.recipe.name == "gemm"
    case: Any = sel.recipe.build(op, _ctx())
    return str(case.note)


def _expert(impl: ExpertsImpl, experts: int) -> ExpertGemm:
    return ExpertGemm(impl=impl, experts=experts, top_k=2, part=ExpertPart.GATE_UP)


def test_a_renamed_batched_mm_gemm_gathers_from_the_fields_experts() -> None:
    pairs = 6
    ins = (TensorSpec(shape=(pairs, 96, 64), dtype=BF16), TensorSpec(shape=(pairs, 64, 1), dtype=BF16))
    op = Gemm(
        id=0,
        m=1,
        n=96,
        k=64,
        batch=pairs,
        definition="experts_up",
        inputs=ins,
        expert=_expert(ExpertsImpl.BATCHED_MM, 16),
    )
    assert is_batched_mm(op)
    note = _note(op)
    assert note.startswith("batched_mm:") and f"over {pairs} gathered per-pair weights of 16 experts" in note
    # The same GEMM named as capture names it (the legacy path reads the field from the name) runs alike.
    named = op.model_copy(update={"definition": "moe_batched_mm_e16_h64_i48_topk2_gate_up", "expert": None})
    legacy = Gemm.model_validate(named.model_dump(exclude={"expert"}))
    assert legacy.expert == op.expert and _note(legacy) == note
    # Named batched_mm but without the field: a plain bmm.
    plain = Gemm.model_validate(
        {**op.model_dump(), "definition": "moe_batched_mm_e16_h64_i48_topk2_gate_up", "expert": None}
    )
    assert not is_batched_mm(plain) and _note(plain) == "torch.bmm"


def test_a_renamed_grouped_gemm_runs_the_fields_implementation() -> None:
    experts, m = 4, 3
    loop = Gemm(
        id=0, m=m, n=32, k=16, groups=experts, definition="experts_up", expert=_expert(ExpertsImpl.LOOP, experts)
    )
    assert _note(loop).startswith("eager per-expert F.linear")
    ins = (
        TensorSpec(shape=(experts, m, 16), dtype=BF16),
        TensorSpec(shape=(experts, 16, 32), dtype=BF16, strides=(512, 1, 16)),
    )
    bmm = loop.model_copy(update={"expert": _expert(ExpertsImpl.BMM, experts), "inputs": ins})
    assert "recorded layouts" in _note(bmm)
    # A name that says bmm does not make a loop expert GEMM one.
    assert _note(
        bmm.model_copy(update={"definition": "moe_bmm_e4_h16_topk2_gate_up", "expert": loop.expert})
    ).startswith("eager per-expert F.linear")
