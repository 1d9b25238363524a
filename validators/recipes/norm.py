"""Norms replayed as transformers computes them: HF RMSNorm (float32 inside), ``F.layer_norm``."""

from __future__ import annotations

from typing import Any

from opgraph.ir import Norm, NormVariant, TensorSpec
from validators.inputs import make_tensor
from validators.recipes.base import BuildContext, Case, Recipe
from validators.recipes.registry import register_recipe

RMS_EPS = 1e-6
LAYER_EPS = 1e-5


@register_recipe(Norm)
class NormRecipe(Recipe[Norm]):
    """RMSNorm as ``LlamaRMSNorm.forward`` (upcast, mean of squares, rsqrt, downcast, scale); LayerNorm."""

    name = "norm"

    def build(self, op: Norm, ctx: BuildContext) -> Case:
        import torch
        import torch.nn.functional as F

        x_spec = next(
            (t for t in op.inputs if t.dtype.is_float and t.shape and t.shape[-1] == op.hidden and len(t.shape) > 1),
            None,
        )
        if x_spec is None:
            x_spec = TensorSpec(shape=(max(op.rows, 0), op.hidden), dtype=op.dtype)
        w_spec = next((t for t in op.inputs if t.shape == (op.hidden,) and t.dtype.is_float), None)
        w_spec = w_spec or TensorSpec(shape=(op.hidden,), dtype=op.dtype)
        x = make_tensor(x_spec, ctx.device, ctx.gen)
        w = make_tensor(w_spec, ctx.device, ctx.gen)

        if op.variant is NormVariant.RMS:

            def run(inputs: tuple[Any, ...], reference: bool) -> Any:
                hs, weight = inputs
                in_dtype = hs.dtype
                acc = torch.float64 if reference else torch.float32
                hs = hs.to(acc)
                variance = hs.pow(2).mean(-1, keepdim=True)
                hs = hs * torch.rsqrt(variance + RMS_EPS)
                return weight * hs.to(in_dtype)

            return Case(inputs=(x, w), run=run, note="HF RMSNorm")

        b = make_tensor(w_spec, ctx.device, ctx.gen)

        def run_ln(inputs: tuple[Any, ...], reference: bool) -> Any:
            hs, weight, bias = inputs
            return F.layer_norm(hs, (hs.shape[-1],), weight, bias, LAYER_EPS)

        return Case(inputs=(x, w, b), run=run_ln, note="F.layer_norm")
