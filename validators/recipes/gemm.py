"""GEMMs without a recorded call: linear layers, batched products and grouped expert GEMMs.

A grouped GEMM (``groups > 1``: the experts of a MoE layer) runs the way its target says the model
ran it: ``torch.nn.functional.grouped_mm`` / ``torch._grouped_mm`` for a ``grouped_mm`` target,
``torch.bmm`` over padded groups for ``batched_mm``, and otherwise transformers' eager loop of one
``F.linear`` per expert on that expert's rows. Rows per expert follow the graph's routing
assumption (balanced unless the graph records a skew); ``m`` is the mean rows per group.
"""

from __future__ import annotations

from typing import Any

from opgraph.ir import Gemm, TensorSpec
from validators.inputs import make_tensor, routing_counts, torch_dtype
from validators.recipes.base import BuildContext, Case, Recipe
from validators.recipes.registry import register_recipe


def _grouped_mm_fn() -> Any:
    import torch

    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


@register_recipe(Gemm)
class GemmRecipe(Recipe[Gemm]):
    """``F.linear`` (``x @ W.T`` with an ``[n, k]`` weight, as ``nn.Linear`` stores it), bmm, grouped GEMM."""

    name = "gemm"

    def build(self, op: Gemm, ctx: BuildContext) -> Case:
        import torch
        import torch.nn.functional as F

        dt = op.dtype
        out_dtype = torch_dtype(op.out_dtype) if op.out_dtype else None
        if op.groups > 1:
            return self._grouped(op, ctx)
        if op.batch > 1:
            a = make_tensor(TensorSpec(shape=(op.batch, op.m, op.k), dtype=dt), ctx.device, ctx.gen)
            b = make_tensor(TensorSpec(shape=(op.batch, op.k, op.n), dtype=dt), ctx.device, ctx.gen)

            def run_bmm(inputs: tuple[Any, ...], reference: bool) -> Any:
                return torch.bmm(inputs[0], inputs[1])

            return Case(inputs=(a, b), run=run_bmm, note="torch.bmm")
        x = make_tensor(TensorSpec(shape=(op.m, op.k), dtype=dt), ctx.device, ctx.gen)
        w = make_tensor(TensorSpec(shape=(op.n, op.k), dtype=dt), ctx.device, ctx.gen)
        bias = (
            make_tensor(TensorSpec(shape=(op.n,), dtype=op.out_dtype or dt), ctx.device, ctx.gen) if op.bias else None
        )

        def run(inputs: tuple[Any, ...], reference: bool) -> Any:
            out = F.linear(inputs[0], inputs[1], inputs[2])
            return out.to(out_dtype) if out_dtype is not None and not reference else out

        return Case(inputs=(x, w, bias), run=run, note="F.linear")

    def _grouped(self, op: Gemm, ctx: BuildContext) -> Case:
        import torch
        import torch.nn.functional as F

        g = op.groups
        counts = routing_counts(op.m * g, g, 1, ctx.moe_skew)
        total = sum(counts)
        x = make_tensor(TensorSpec(shape=(total, op.k), dtype=op.dtype), ctx.device, ctx.gen)
        w = make_tensor(TensorSpec(shape=(g, op.n, op.k), dtype=op.dtype), ctx.device, ctx.gen)
        target = f"{op.target} {op.definition}".lower()
        grouped = _grouped_mm_fn()
        rec = [t for t in op.inputs if len(t.shape) == 3 and t.dtype.is_float]
        if ("bmm" in target or "batched_mm" in target) and len(rec) >= 2:
            # One bmm over the active experts, in the recorded layouts (weights as transposed views).
            a = make_tensor(rec[0], ctx.device, ctx.gen)
            b = make_tensor(rec[1], ctx.device, ctx.gen)

            def run_rec_bmm(inputs: tuple[Any, ...], reference: bool) -> Any:
                return torch.bmm(inputs[0], inputs[1])

            return Case(inputs=(a, b), run=run_rec_bmm, note=f"torch.bmm over {g} experts (recorded layouts)")
        skew = f"skew {ctx.moe_skew:g}" if ctx.moe_skew > 0 else "balanced"
        if "grouped_mm" in target and grouped is not None:
            offs = torch.tensor(counts, device=ctx.device, dtype=torch.int32).cumsum(0).to(torch.int32)

            def run_grouped(inputs: tuple[Any, ...], reference: bool) -> Any:
                xx, ww, oo = inputs
                if reference:  # no float64 grouped kernel: the same products, one group at a time
                    outs, start = [], 0
                    for e, c in enumerate(counts):
                        outs.append(xx[start : start + c] @ ww[e].transpose(-1, -2))
                        start += c
                    return torch.cat(outs)
                return grouped(xx, ww.transpose(-1, -2), offs=oo)

            return Case(inputs=(x, w, offs), run=run_grouped, note=f"grouped_mm, {skew} routing")
        if "batched_mm" in target:
            width = max(counts)
            xb = make_tensor(TensorSpec(shape=(g, width, op.k), dtype=op.dtype), ctx.device, ctx.gen)

            def run_batched(inputs: tuple[Any, ...], reference: bool) -> Any:
                return torch.bmm(inputs[0], inputs[1].transpose(-1, -2))

            return Case(inputs=(xb, w), run=run_batched, note=f"batched_mm over {g} padded groups")

        def run_loop(inputs: tuple[Any, ...], reference: bool) -> Any:
            xx, ww = inputs
            outs, start = [], 0
            for e, c in enumerate(counts):
                if c:
                    outs.append(F.linear(xx[start : start + c], ww[e]))
                start += c
            return tuple(outs)

        return Case(inputs=(x, w), run=run_loop, note=f"eager per-expert F.linear, {skew} routing")
