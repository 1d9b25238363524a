"""Typed replays of simple ops that came without a recorded call: activations, elementwise ops,
softmax, reductions, top-k and embedding lookups. Shapes come from the op's tensors when present,
else from its fields (``numel`` elements as rows of ``hidden``)."""

from __future__ import annotations

from typing import Any, TypeVar

from opgraph.ir import (
    SCALAR_OPERAND_FNS,
    Activation,
    DType,
    Elementwise,
    Embedding,
    OpBase,
    Reduction,
    Softmax,
    TensorSpec,
    TopK,
)
from validators.inputs import NORMAL, POSITIVE, Domain, DomainKind, index, make_tensor
from validators.recipes.aten import POSITIVE_FIRST, POSITIVE_SECOND
from validators.recipes.base import BuildContext, Case, Compare, Recipe
from validators.recipes.registry import register_recipe

GATED_BASE: dict[str, str] = {
    "swiglu": "silu",
    "geglu": "gelu",
    "geglu_tanh": "gelu_tanh",
    "reglu": "relu",
    "glu": "sigmoid",
}
"""The activation inside each gated form, by the ``fn`` capture records (``act(gate) * up``).

Keyed by :attr:`opgraph.ir.Activation.fn`: if capture renames a gated form, change its key here."""
BINARY = frozenset({"add", "sub", "mul", "maximum", "minimum", "pow", "where"}) | POSITIVE_SECOND
"""Elementwise ops of two tensors (divisions: the second is a non-zero divisor)."""


TorchFnOp = TypeVar("TorchFnOp", Elementwise, Reduction)


class _TorchFnRecipe(Recipe[TorchFnOp]):
    """A recipe that replays an op by calling ``torch.<op.fn>``: it cannot where torch has no such function."""

    def unsupported(self, op: TorchFnOp) -> str | None:
        """Why ``torch.<op.fn>`` cannot replay ``op`` (``None`` when it exists)."""
        import torch

        if not callable(getattr(torch, op.fn, None)):
            return f"{op.target or op.fn}: no torch function {op.fn!r} to replay"
        return None


def _rows_spec(op: OpBase, numel: int, hidden: int) -> TensorSpec:
    hidden = max(hidden, 1)
    return TensorSpec(shape=(max(numel, 0) // hidden, hidden), dtype=op.dtype)


def _act(fn: str) -> Any:
    """The torch function of activation ``fn`` (the inner activation of a gated form), or ``None``."""
    import torch.nn.functional as F

    table = {
        "silu": F.silu,
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "relu": F.relu,
        "sigmoid": F.sigmoid,
        "tanh": F.tanh,
    }
    return table.get(GATED_BASE.get(fn, fn))


@register_recipe(Activation)
class ActivationRecipe(Recipe[Activation]):
    """``act(x)``, or ``act(gate) * up`` for gated MLPs (HF: ``act_fn(gate_proj(x)) * up_proj(x)``)."""

    name = "activation"

    def unsupported(self, op: Activation) -> str | None:
        if _act(op.fn) is None:
            return f"{op.target or op.fn}: no replay recipe for activation {op.fn!r}"
        return None

    def build(self, op: Activation, ctx: BuildContext) -> Case:
        act = _act(op.fn)
        gated = op.gated or op.fn in GATED_BASE
        specs = [t for t in op.inputs if t.dtype.is_float][: 2 if gated else 1]
        if gated and len(specs) == 1:
            # gate and up are the two halves of one projection (``gate_up(x).chunk(2, -1)``).
            half = specs[0].shape[-1]
            base_spec = TensorSpec(shape=(*specs[0].shape[:-1], 2 * half), dtype=specs[0].dtype)
            base = make_tensor(base_spec, ctx.device, ctx.gen)
            xs: tuple[Any, ...] = (base[..., :half], base[..., half:])
        else:
            while len(specs) < (2 if gated else 1):
                specs.append(_rows_spec(op, op.numel, op.hidden))
            xs = tuple(make_tensor(s, ctx.device, ctx.gen) for s in specs)

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            return act(inputs[0]) * inputs[1] if gated else act(inputs[0])

        return Case(inputs=xs, run=run, note=f"{op.fn}{' gated' if gated else ''}")


@register_recipe(Elementwise)
class ElementwiseRecipe(_TorchFnRecipe[Elementwise]):
    """``torch.<fn>`` over the op's tensors (binary ops get two same-shaped inputs when none are recorded)."""

    name = "elementwise"

    def unsupported(self, op: Elementwise) -> str | None:
        if op.scalar and op.fn not in SCALAR_OPERAND_FNS:
            return f"{op.target or op.fn}: {op.fn!r} takes no scalar operand"
        return super().unsupported(op)

    def build(self, op: Elementwise, ctx: BuildContext) -> Case:
        import torch

        fn = getattr(torch, op.fn)
        dom = POSITIVE if op.fn in POSITIVE_FIRST else NORMAL
        if op.scalar:  # ``x * 2.0``: one tensor, the recorded one of more than one element if any
            spec = next((t for t in op.inputs if t.numel > 1), None) or _rows_spec(op, op.numel, op.hidden)
            x = make_tensor(spec, ctx.device, ctx.gen, dom)
            return Case(inputs=(x,), run=lambda inputs, reference: fn(inputs[0], 2.0), note=f"torch.{op.fn} by 2.0")
        if op.fn == "where" and len(op.inputs) == 2:
            # ``where(rows, 0.0, x)`` (SDPA's safe softmax zeroing fully masked rows): the recorded operands are
            # the values and the condition, read through its recorded (broadcast) layout
            cond = op.inputs[1].model_copy(update={"dtype": DType.bool})
            xs = [make_tensor(cond, ctx.device, ctx.gen), make_tensor(op.inputs[0], ctx.device, ctx.gen, dom)]
            return Case(
                inputs=tuple(xs), run=lambda inputs, reference: torch.where(inputs[0], 0.0, inputs[1]),
                note="torch.where(condition, 0.0, x)",
            )  # fmt: skip
        if op.inputs:
            xs = [
                make_tensor(s, ctx.device, ctx.gen, POSITIVE if (i == 1 and op.fn in POSITIVE_SECOND) else dom)
                for i, s in enumerate(op.inputs)
            ]
        else:
            n = 2 if op.fn in BINARY else 1
            xs = [
                make_tensor(
                    _rows_spec(op, op.numel, op.hidden),
                    ctx.device,
                    ctx.gen,
                    POSITIVE if i == 1 and op.fn in POSITIVE_SECOND else dom,
                )
                for i in range(n)
            ]
            if op.fn == "where":
                xs.insert(0, xs[0] > 0)

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            return fn(*inputs)

        return Case(inputs=tuple(xs), run=run, note=f"torch.{op.fn}")


@register_recipe(Softmax)
class SoftmaxRecipe(Recipe[Softmax]):
    """``softmax`` over the last dim (in float32 and back when the op's output is float32)."""

    name = "softmax"

    def build(self, op: Softmax, ctx: BuildContext) -> Case:
        import torch

        spec = next((t for t in op.inputs if t.dtype.is_float), None) or TensorSpec(
            shape=(op.rows, op.cols), dtype=op.dtype
        )
        x = make_tensor(spec, ctx.device, ctx.gen)
        if op.masked:  # causal: each row's columns past its position (in square blocks of cols rows) filled
            rows = x.view(-1, x.shape[-1])
            pos = torch.arange(rows.shape[0], device=x.device) % rows.shape[1]
            cols = torch.arange(rows.shape[1], device=x.device)
            rows.masked_fill_(cols[None, :] > pos[:, None], torch.finfo(x.dtype).min)
        fp32_out = any(t.dtype.value == "fp32" for t in op.outputs) and spec.dtype.value != "fp32"

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            acc = torch.float64 if reference else torch.float32
            return torch.softmax(inputs[0], dim=-1, dtype=acc if fp32_out else None)

        return Case(inputs=(x,), run=run, note=f"softmax{' (causally masked)' if op.masked else ''}")


@register_recipe(Reduction)
class ReductionRecipe(_TorchFnRecipe[Reduction]):
    """``torch.<fn>(x, dim=-1)`` over ``reduced`` elements per output."""

    name = "reduction"

    def build(self, op: Reduction, ctx: BuildContext) -> Case:
        import torch

        fn = getattr(torch, op.fn)
        spec = next((t for t in op.inputs if t.dtype.is_float), None) or _rows_spec(op, op.numel_in, op.reduced)
        x = make_tensor(spec, ctx.device, ctx.gen)
        compare = Compare.FLOAT_ONLY if op.fn in ("max", "min") else Compare.ALL

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            return fn(inputs[0], dim=-1)

        return Case(inputs=(x,), run=run, compare=compare, note=f"torch.{op.fn}(dim=-1)")


@register_recipe(TopK)
class TopKRecipe(Recipe[TopK]):
    """``topk``, ``argmax``, ``sort``, ``multinomial`` over the last dim."""

    name = "topk"

    def unsupported(self, op: TopK) -> str | None:
        if op.fn not in ("topk", "argmax", "sort", "multinomial", "argsort"):
            return f"{op.target or op.fn}: no replay recipe for {op.fn!r}"
        return None

    def build(self, op: TopK, ctx: BuildContext) -> Case:
        import torch

        spec = next((t for t in op.inputs if t.dtype.is_float), None) or TensorSpec(
            shape=(op.rows, op.cols), dtype=op.dtype
        )
        dom = Domain(DomainKind.PROBS) if op.fn == "multinomial" else NORMAL
        x = make_tensor(spec, ctx.device, ctx.gen, dom)
        k = min(op.k, op.cols)
        fn = op.fn

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            (xx,) = inputs
            if fn == "topk":
                return torch.topk(xx, k, dim=-1)
            if fn == "argmax":
                return torch.argmax(xx, dim=-1)
            if fn == "sort":
                return torch.sort(xx, dim=-1)
            if fn == "argsort":
                return torch.argsort(xx, dim=-1)
            return torch.multinomial(xx.reshape(-1, xx.shape[-1]).float(), k)

        compare = Compare.NONE if fn in ("multinomial", "argmax", "argsort") else Compare.FLOAT_ONLY
        note = "random op: not compared" if fn == "multinomial" else "indices not compared (ties)"
        return Case(inputs=(x,), run=run, compare=compare, note=note)


@register_recipe(Embedding)
class EmbeddingRecipe(Recipe[Embedding]):
    """``F.embedding`` of ``tokens`` ids in ``[0, vocab)`` from a ``[vocab, hidden]`` table."""

    name = "embedding"

    def build(self, op: Embedding, ctx: BuildContext) -> Case:
        import torch.nn.functional as F

        ids_spec = next((t for t in op.inputs if not t.dtype.is_float), None) or TensorSpec(
            shape=(1, max(op.tokens, 0)),
            dtype="int64",
        )
        table = make_tensor(TensorSpec(shape=(op.vocab, op.hidden), dtype=op.dtype), ctx.device, ctx.gen)
        ids = make_tensor(ids_spec, ctx.device, ctx.gen, index(op.vocab))

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            return F.embedding(inputs[0], inputs[1])

        return Case(inputs=(ids, table), run=run, note="F.embedding")
