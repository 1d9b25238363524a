"""Every recipe replays on the CPU and matches float64; failures become statuses, never crashes."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from replay_helpers import FAST, tiny_graph

from opgraph.ir import (
    Attention,
    DType,
    EagerPass,
    Elementwise,
    Gemm,
    Norm,
    OpBase,
    OpKind,
    Other,
    Reduction,
    RegistryError,
    Rope,
)
from tests.ir_builders import mm, t
from validators import RECIPES, Case, Recipe, ReplayStatus, register_recipe, replay_graph, replay_op
from validators.recipes import BuildContext, RecipeSelector
from validators.replay import ReplayOptions


@pytest.fixture(scope="module")
def tiny_results() -> dict[str, Any]:
    return {r.definition + "/" + r.recipe: r for r in replay_graph(tiny_graph(), "cpu", FAST)}


def test_every_config_has_a_status_and_all_known_ops_match(tiny_results: dict[str, Any]) -> None:
    statuses = {k: r.status for k, r in tiny_results.items()}
    bad = {k: (r.status.value, r.reason) for k, r in tiny_results.items()
           if r.status not in (ReplayStatus.OK, ReplayStatus.SKIPPED, ReplayStatus.UNSUPPORTED)}  # fmt: skip
    assert not bad
    assert statuses["fancy_op/"] is ReplayStatus.UNSUPPORTED
    assert "mylib.fancy_op.default" in tiny_results["fancy_op/"].reason
    assert statuses["all_reduce_g2_b4096/"] is ReplayStatus.SKIPPED
    for r in tiny_results.values():
        if r.status is ReplayStatus.OK:
            assert r.timing is not None and r.timing.median_us > 0
            assert r.numerics is not None and r.numerics.ok
            assert r.device == "cpu" and r.device_name


def test_recipes_chosen_as_the_model_runs_them(tiny_results: dict[str, Any]) -> None:
    keys = set(tiny_results)
    # Recorded aten calls replay exactly; composites by their kind's recipe.
    assert "gqa_ragged_prefill_causal_h4_kv2_d8/aten" in keys
    assert "gqa_ragged_prefill_causal_h4_kv2_d8/attention" in keys  # chunked prefill (q 4 < kv 8): mask
    assert "rmsnorm_h32/norm" in keys and "rope_h4_d8/rope" in keys
    assert "moe_bmm_e4_h32_i48_topk2_gate_up/gemm" in keys
    notes = {k: r.numerics.note for k, r in tiny_results.items() if r.numerics is not None}
    assert notes["gqa_paged_decode_h4_kv2_d8/attention"] == "sdpa enable_gqa"
    assert notes["gqa_ragged_prefill_causal_h4_kv2_d8/attention"] == "sdpa bool mask"
    assert "recorded layouts" in notes["moe_bmm_e4_h32_i48_topk2_gate_up/gemm"]


def test_attention_recipe_matches_an_explicit_causal_reference() -> None:
    op = Attention(id=0, batch=1, q_len=3, kv_len=5, heads=2, kv_heads=1, head_dim=4, dtype="fp32")  # type: ignore[arg-type]
    sel = RecipeSelector().select(op)
    assert sel.recipe is not None
    gen = torch.Generator().manual_seed(0)
    case = sel.recipe.build(op, BuildContext(torch.device("cpu"), gen))
    q, k, v, _mask = case.inputs
    out = case()
    kk = k.repeat_interleave(2, dim=1) if k.shape[1] == 1 else k
    vv = v.repeat_interleave(2, dim=1) if v.shape[1] == 1 else v
    scores = (q @ kk.transpose(-1, -2)) / 2.0
    allowed = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    ref = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ vv
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_eager_attention_replays_its_recorded_passes_as_the_model_runs_them() -> None:
    # transformers' eager_attention_forward: scale, additive causal mask, float32 softmax, cast back.
    passes = (
        EagerPass(kind=OpKind.ELEMENTWISE, fn="mul", read=4, written=4, dtype=DType.fp32),
        EagerPass(kind=OpKind.ELEMENTWISE, fn="add", read=4, written=4, dtype=DType.fp32),
        EagerPass(kind=OpKind.SOFTMAX, fn="_softmax", read=4, written=4, dtype=DType.fp32),
    )
    op = Attention(id=0, batch=1, q_len=3, kv_len=5, heads=2, kv_heads=1, head_dim=4, dtype="fp32", eager=passes)  # type: ignore[arg-type]
    sel = RecipeSelector().select(op)
    assert sel.recipe is not None
    case = sel.recipe.build(op, BuildContext(torch.device("cpu"), torch.Generator().manual_seed(0)))
    assert case.note == "eager: q @ k^T, mul, add, _softmax, @ v"
    q, k, v, _mask, _sinks, _alibi = case.inputs
    assert k.shape[1] == 2  # every query head's keys: the graph's repeat_kv copies made them
    allowed = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    ref = torch.softmax(((q @ k.transpose(-1, -2)) / 2.0).masked_fill(~allowed, float("-inf")), -1) @ v
    torch.testing.assert_close(case(), ref, rtol=1e-5, atol=1e-5)
    # gpt-oss's sinks: a column per row concatenated, the row max subtracted, the column dropped again
    sinks = (
        *passes[:2],
        EagerPass(kind=OpKind.MEMORY, fn="cat", read=4, written=4, dtype=DType.fp32),
        EagerPass(kind=OpKind.REDUCTION, fn="max", read=4, written=0, dtype=DType.fp32),
        EagerPass(kind=OpKind.ELEMENTWISE, fn="sub", read=4, written=4, dtype=DType.fp32),
        passes[2],
    )
    case = sel.recipe.build(
        op.model_copy(update={"eager": sinks}), BuildContext(torch.device("cpu"), torch.Generator())
    )
    q, k, v, _mask, s, _alibi = case.inputs
    logits = torch.cat([((q @ k.transpose(-1, -2)) / 2.0).masked_fill(~allowed, float("-inf")), s], dim=-1)
    ref = torch.softmax(logits - logits.amax(-1, keepdim=True), -1)[..., :-1] @ v
    torch.testing.assert_close(case(), ref, rtol=1e-5, atol=1e-5)
    result = replay_op(op.model_copy(update={"eager": sinks}), device="cpu", options=FAST)
    assert result.status is ReplayStatus.OK and result.numerics is not None
    # BLOOM's baddbmm(alibi, q, k^T, alpha=scale): its addend copied into the scores, the product added on;
    # casts to float32 and back around the softmax (a cast's dtype is the one it reads)
    bloom = (
        EagerPass(kind=OpKind.MEMORY, fn="addend", read=4 / 5, written=4, broadcast=True, addend=True),
        passes[1],
        EagerPass(kind=OpKind.MEMORY, fn="cast", read=2, written=4, dtype=DType.bf16),
        passes[2],
        EagerPass(kind=OpKind.MEMORY, fn="cast", read=4, written=2, dtype=DType.fp32),
    )
    case = sel.recipe.build(
        op.model_copy(update={"eager": bloom}), BuildContext(torch.device("cpu"), torch.Generator())
    )
    q, k, v, _mask, _sinks, alibi = case.inputs
    assert alibi.shape == (2, 1, 5) and case.note == "eager: baddbmm, add, cast, _softmax, cast, @ v"
    logits = (q @ k.transpose(-1, -2)) / 2.0 + alibi.view(1, 2, 1, 5)
    ref = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v
    torch.testing.assert_close(case(), ref, rtol=1e-5, atol=1e-5)


class _NoisyGemm(Recipe):
    """Right on the reference, wrong on the device: must be reported as a mismatch."""

    name: ClassVar[str] = "noisy"

    def build(self, op: OpBase, ctx: BuildContext) -> Case:
        inner = RECIPES.get("gemm")().build(op, ctx)

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            out = inner.run(inputs, reference)
            return out if reference else out * 1.1

        return Case(inputs=inner.inputs, run=run)


class _Exploding(Recipe):
    name: ClassVar[str] = "exploding"

    def build(self, op: OpBase, ctx: BuildContext) -> Case:
        raise ValueError("boom")


class _OutOfMemory(Recipe):
    name: ClassVar[str] = "oom"

    def build(self, op: OpBase, ctx: BuildContext) -> Case:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")


def test_mismatch_error_and_oom_are_statuses() -> None:
    op = Gemm(id=0, m=4, n=8, k=16)
    for recipe, status, text in (
        (_NoisyGemm, ReplayStatus.MISMATCH, "beyond tolerance"),
        (_Exploding, ReplayStatus.ERROR, "ValueError: boom"),
        (_OutOfMemory, ReplayStatus.OOM, "out of memory"),
    ):
        name = f"test-{recipe.name}"
        if name not in RECIPES:
            RECIPES.register(name, recipe)
        opts = ReplayOptions(timing=FAST.timing, recipes={"gemm_n8_k16": name})
        r = replay_op(op, "cpu", opts)
        assert r.status is status, r.reason
        assert text in r.reason
        if status is ReplayStatus.MISMATCH:
            assert r.timing is not None and r.numerics is not None
            assert r.numerics.max_rel > 0.05


def test_no_check_skips_numerics() -> None:
    r = replay_op(mm(0, 4, 8, 16), "cpu", ReplayOptions(timing=FAST.timing, check=False))
    assert r.status is ReplayStatus.OK and r.numerics is None and r.timing is not None


def test_unknown_aten_target_is_unsupported_with_its_name() -> None:
    op = mm(0, 4, 8, 16).model_copy(update={"target": "aten.mm_from_the_future.default"})
    other = Other(id=1, target=op.target, fn="mm_from_the_future", inputs=op.inputs, call=op.call)
    r = replay_op(other, "cpu", FAST)
    assert r.status is ReplayStatus.UNSUPPORTED
    assert "aten.mm_from_the_future.default" in r.reason


def test_aten_recipe_decodes_arguments_once_not_in_the_timed_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # Decoding the recorded call on every run would count the harness's Python as issue time.
    from validators.recipes import aten
    from validators.recipes.aten import AtenRecipe

    op = mm(0, 4, 8, 16)
    ctx = BuildContext(torch.device("cpu"), torch.Generator().manual_seed(0))
    case = AtenRecipe().build(op, ctx)
    decoded: list[object] = []
    real = aten._decode
    monkeypatch.setattr(aten, "_decode", lambda *a: (decoded.append(a[0]), real(*a))[1])
    out = case()
    assert not decoded and out.shape == (4, 8)
    assert torch.equal(case(), out)
    # Other inputs (the float64 reference, another device's copies) are decoded per call.
    ref = case.run(tuple(x.double() for x in case.inputs), True)
    assert decoded and ref.dtype == torch.float64
    torch.testing.assert_close(ref.float(), out.float(), rtol=0.02, atol=0.05)


class ScaledTanh(Other):
    """A user's own op: ``tanh(x) * scale`` over ``numel`` elements (a kind replay has no recipe for)."""

    numel: int
    scale: float


@register_recipe(ScaledTanh)
class ScaledTanhRecipe(Recipe[ScaledTanh]):
    name: ClassVar[str] = "test-scaled-tanh"

    def build(self, op: ScaledTanh, ctx: BuildContext) -> Case:
        x = torch.randn(op.numel, generator=ctx.gen, device=ctx.device).to(torch.bfloat16)

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            return torch.tanh(inputs[0]) * op.scale

        return Case(inputs=(x,), run=run)


def test_a_users_op_class_replays_through_its_registered_recipe() -> None:
    op = ScaledTanh(id=0, fn="scaled_tanh", numel=64, scale=2.0)
    r = replay_op(op, "cpu", FAST)
    assert r.status is ReplayStatus.OK, r.reason
    assert r.recipe == "test-scaled-tanh"
    assert r.numerics is not None and r.numerics.compared == 1
    # The recipe serves its class only: a plain Other op of the same name still has none.
    plain = replay_op(Other(id=1, fn="scaled_tanh"), "cpu", FAST)
    assert plain.status is ReplayStatus.UNSUPPORTED


def test_register_recipe_refuses_a_second_recipe_for_an_op_class_or_name() -> None:
    class Again(Recipe[ScaledTanh]):
        name: ClassVar[str] = "test-scaled-tanh-again"

        def build(self, op: ScaledTanh, ctx: BuildContext) -> Case:
            raise NotImplementedError

    with pytest.raises(RegistryError, match="ScaledTanh ops already have the replay recipe 'test-scaled-tanh'"):
        register_recipe(ScaledTanh)(Again)
    with pytest.raises(RegistryError, match="Gemm ops already have the replay recipe 'gemm'"):
        register_recipe(OpKind.GEMM)(Again)
    Again.name = "gemm"
    with pytest.raises(RegistryError, match="already registered"):
        register_recipe()(Again)


def test_an_override_naming_a_recipe_of_another_op_class_is_refused() -> None:
    norm = Norm(id=0, rows=4, hidden=8)
    sel = RecipeSelector({norm.definition: "gemm"}).select(norm)
    assert sel.recipe is None and "the gemm recipe needs a Gemm op" in sel.reason


@pytest.mark.parametrize("fn", ["div", "remainder", "fmod", "floor_divide"])
def test_typed_divisions_get_a_divisor_and_match(fn: str) -> None:
    # The elementwise recipe shares the aten recipe's domain tables: every division takes a second,
    # non-zero input (it used to know only ``div`` and called remainder/fmod with one argument).
    from opgraph.ir import Elementwise

    op = Elementwise(id=0, fn=fn, numel=512, hidden=64, dtype=DType.fp32)
    r = replay_op(op, "cpu", FAST)
    assert r.status is ReplayStatus.OK, r.reason
    case = RecipeSelector().select(op).recipe.build(op, BuildContext(torch.device("cpu"), torch.Generator()))  # type: ignore[union-attr]
    assert len(case.inputs) == 2 and bool((case.inputs[1] > 0).all())


@pytest.mark.parametrize(
    "op",
    [
        Elementwise(id=0, fn="no_such_fn", numel=8, hidden=8),
        Reduction(id=0, fn="no_such_fn", numel_in=8, numel_out=1, reduced=8),
    ],
    ids=["elementwise", "reduction"],
)
def test_torch_function_recipes_refuse_a_function_torch_lacks(op: OpBase) -> None:
    sel = RecipeSelector().select(op)
    assert sel.recipe is None and "no torch function 'no_such_fn' to replay" in sel.reason


def test_an_op_by_a_scalar_replays_one_tensor_and_a_function_without_one_is_refused() -> None:
    mul = Elementwise(id=0, fn="mul", numel=8, hidden=4, scalar=True)
    case = RecipeSelector().select(mul).recipe.build(mul, BuildContext(torch.device("cpu"), torch.Generator()))  # type: ignore[union-attr]
    (x,) = case.inputs
    assert x.shape == (2, 4) and torch.equal(case(), x * 2.0)
    sel = RecipeSelector().select(Elementwise(id=0, fn="rsqrt", numel=8, hidden=4, scalar=True))
    assert sel.recipe is None and "'rsqrt' takes no scalar operand" in sel.reason


def _rope_case(op: Rope) -> tuple[Case, ReplayStatus]:
    """The rope recipe's case for ``op`` on the CPU, and the op's replay status."""
    sel = RecipeSelector().select(op)
    assert sel.recipe is not None and sel.recipe.name == "rope"
    case = sel.recipe.build(op, BuildContext(torch.device("cpu"), torch.Generator().manual_seed(0)))
    return case, replay_op(op, "cpu", FAST).status


def test_rope_recipe_replays_a_partial_rotary_slice_with_the_rest_of_each_head() -> None:
    # Phi-style capture: the recorded input is the rotated slice [..., :8] of 16-wide heads.
    seq, h = 8, 4
    slice_strides = (seq * h * 16, 16, h * 16, 1)
    op = Rope(id=0, target="rope", tokens=seq, heads=h, head_dim=16, rotary_dim=8, dtype=DType.fp32,
              inputs=(t(1, h, seq, 8, dtype=DType.fp32, strides=slice_strides),
                      t(1, 1, seq, 8, dtype=DType.fp32), t(1, 1, seq, 8, dtype=DType.fp32)),
              outputs=(t(1, h, seq, 16, dtype=DType.fp32),))  # fmt: skip
    case, status = _rope_case(op)
    (out,) = case()
    assert tuple(out.shape) == (1, h, seq, 16)
    x = case.inputs[2]
    torch.testing.assert_close(out[..., 8:], x[..., 8:])  # the untouched rest of each head
    assert status is ReplayStatus.OK


@pytest.mark.parametrize(
    ("heads", "head_dim", "rotary_dim", "x_shape"),
    [(4, 24, 8, (1, 4, 8, 4)), (1, 8, None, (1, 1, 8, 4))],  # MLA's query, and its one-head rope key
)
def test_rope_recipe_builds_from_the_fields_when_recorded_shapes_disagree(
    heads: int, head_dim: int, rotary_dim: int | None, x_shape: tuple[int, ...]
) -> None:
    # DeepSeek's interleaved rope records half-width views ([..., 0::2]) of the rotated part.
    op = Rope(id=0, target="rope", tokens=8, heads=heads, head_dim=head_dim, rotary_dim=rotary_dim,
              dtype=DType.fp32, inputs=(t(*x_shape, dtype=DType.fp32), t(1, 1, 8, 4, dtype=DType.fp32),
                                        t(1, 1, 8, 4, dtype=DType.fp32)))  # fmt: skip
    case, status = _rope_case(op)
    (out,) = case()
    assert tuple(out.shape) == (1, heads, 8, head_dim)
    assert status is ReplayStatus.OK
