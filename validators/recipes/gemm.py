"""GEMMs without a recorded call: linear layers, batched products and grouped expert GEMMs.

A grouped GEMM (``groups > 1``: the experts of a MoE layer) runs the way the model ran it
(:func:`~opgraph.ir.grouped_kernel`: an expert GEMM's ``expert`` field, else the aten op of its target):
``torch.nn.functional.grouped_mm`` / ``torch._grouped_mm`` for ``grouped_mm``, one ``torch.bmm`` over
the experts in the recorded layouts for ``bmm``, and otherwise transformers' eager loop of one
``F.linear`` per expert on that expert's rows. Rows per expert
follow the graph's routing assumption (balanced unless the graph records a skew); ``m`` is the mean
rows per group.

An expert GEMM of transformers' ``batched_mm`` experts (``expert.impl`` ``batched_mm``: ``batch``
token-expert pairs, one ``[m x k] @ [k x n]`` product each) runs as that implementation launches it:
the stacked ``[experts, n, k]`` weights gathered by the routed expert ids into one weight copy per
pair (``gate_up_proj[expert_ids]``), then one ``torch.bmm`` of the copies against the pairs' tokens,
weight first (``[n, k] @ [k, 1]``) or, for models that store their weights transposed, token first,
as the recorded inputs say. The gather is a memory op of its own in a captured graph, so it runs
when the case is built and only the ``bmm`` is timed.
"""

from __future__ import annotations

from typing import Any

from opgraph.ir import ExpertsImpl, Gemm, TensorSpec, grouped_kernel
from validators.inputs import make_tensor, routing_counts, torch_dtype
from validators.recipes.base import BuildContext, Case, Recipe
from validators.recipes.registry import register_recipe


def is_batched_mm(op: Gemm) -> bool:
    """Whether ``op`` is an expert GEMM of transformers' ``batched_mm`` experts (one product per
    token-expert pair on its own gathered weight copy), as its ``expert`` field says.

    >>> from opgraph.ir import ExpertGemm
    >>> expert = ExpertGemm(impl="batched_mm", experts=4, top_k=2, part="gate_up")
    >>> is_batched_mm(Gemm(id=0, m=1, n=8, k=4, batch=6, definition="experts_up", expert=expert))
    True
    >>> is_batched_mm(Gemm(id=0, m=1, n=8, k=4, groups=4, expert=expert.model_copy(update={"impl": "bmm"})))
    False
    """
    return op.expert is not None and op.expert.impl is ExpertsImpl.BATCHED_MM


def _grouped_mm_fn() -> Any:
    import torch

    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _operand(op: Gemm, i: int, shape: tuple[int, ...]) -> TensorSpec:
    """Operand ``i`` of a bmm as recorded (its strides: ``q @ K^T`` reads the keys through a transposed
    view), or a contiguous one of ``shape`` when the op records none of that shape and dtype."""
    rec = op.inputs[i] if len(op.inputs) > i else None
    if rec is not None and tuple(rec.shape) == shape and rec.dtype is op.dtype:
        return rec
    return TensorSpec(shape=shape, dtype=op.dtype)


@register_recipe(Gemm)
class GemmRecipe(Recipe[Gemm]):
    """``F.linear`` (``x @ W.T`` with an ``[n, k]`` weight, as ``nn.Linear`` stores it), bmm, grouped GEMM."""

    name = "gemm"

    def build(self, op: Gemm, ctx: BuildContext) -> Case:
        import torch
        import torch.nn.functional as F

        dt = op.dtype
        out_dtype = torch_dtype(op.out_dtype) if op.out_dtype else None
        if is_batched_mm(op):
            return self._batched_mm(op, ctx)
        if op.groups > 1:
            return self._grouped(op, ctx)
        if op.batch > 1:
            a = make_tensor(_operand(op, 0, (op.batch, op.m, op.k)), ctx.device, ctx.gen)
            b = make_tensor(_operand(op, 1, (op.batch, op.k, op.n)), ctx.device, ctx.gen)
            if op.accumulates:  # baddbmm onto what its addend's copy wrote: in place, as the GEMM runs it
                c = make_tensor(_operand(op, 2, (op.batch, op.m, op.n)), ctx.device, ctx.gen)

                def run_baddbmm(inputs: tuple[Any, ...], reference: bool) -> Any:
                    aa, bb, cc = inputs
                    return torch.baddbmm(cc, aa, bb) if reference else cc.baddbmm_(aa, bb)

                return Case(inputs=(a, b, c), run=run_baddbmm, note="baddbmm_ (accumulating)")

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
        kernel = grouped_kernel(op)
        grouped = _grouped_mm_fn()
        rec = [t for t in op.inputs if len(t.shape) == 3 and t.dtype.is_float]
        if kernel == "bmm" and len(rec) >= 2:
            # One bmm over the active experts, in the recorded layouts (weights as transposed views).
            a = make_tensor(rec[0], ctx.device, ctx.gen)
            b = make_tensor(rec[1], ctx.device, ctx.gen)

            def run_rec_bmm(inputs: tuple[Any, ...], reference: bool) -> Any:
                return torch.bmm(inputs[0], inputs[1])

            return Case(inputs=(a, b), run=run_rec_bmm, note=f"torch.bmm over {g} experts (recorded layouts)")
        skew = f"skew {ctx.moe_skew:g}" if ctx.moe_skew > 0 else "balanced"
        if kernel == "grouped_mm" and grouped is not None:
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

        def run_loop(inputs: tuple[Any, ...], reference: bool) -> Any:
            xx, ww = inputs
            outs, start = [], 0
            for e, c in enumerate(counts):
                if c:
                    outs.append(F.linear(xx[start : start + c], ww[e]))
                start += c
            return tuple(outs)

        return Case(inputs=(x, w), run=run_loop, note=f"eager per-expert F.linear, {skew} routing")

    def _batched_mm(self, op: Gemm, ctx: BuildContext) -> Case:
        """transformers' ``batched_mm`` projection: gather each pair's weight copy, then one bmm."""
        import torch

        pairs = op.batch * op.groups
        experts = op.expert.experts if op.expert is not None else pairs
        # transformers' default layout, weight first: each pair's [n, k] copy @ its token as [k, m].
        weight_spec = TensorSpec(shape=(pairs, op.n, op.k), dtype=op.dtype)
        token_spec = TensorSpec(shape=(pairs, op.k, op.m), dtype=op.dtype)
        weight_first = True
        rec = [t for t in op.inputs if len(t.shape) == 3 and t.dtype.is_float]
        if len(rec) == 2:
            a, b = rec
            if a.shape[1:] == (op.n, op.k) and b.shape[1:] == (op.k, op.m):
                weight_spec, token_spec = a, b
            elif a.shape[1:] == (op.m, op.k) and b.shape[1:] == (op.k, op.n):
                # Weights stored transposed (gpt-oss): each pair's token [m, k] @ its [k, n] copy.
                weight_spec, token_spec, weight_first = b, a, False
        # The routed expert of each pair, as the graph's routing assumption deals the pairs' loads.
        counts = routing_counts(pairs, experts, 1, ctx.moe_skew)
        ids = torch.repeat_interleave(torch.arange(experts, device=ctx.device), torch.tensor(counts, device=ctx.device))
        stacked = make_tensor(TensorSpec(shape=(experts, *weight_spec.shape[1:]), dtype=op.dtype), ctx.device, ctx.gen)
        weights = stacked[ids]  # gate_up_proj[expert_ids]: one weight copy per pair
        del stacked
        tokens = make_tensor(token_spec, ctx.device, ctx.gen)
        inputs = (weights, tokens) if weight_first else (tokens, weights)

        def run_batched_mm(inputs: tuple[Any, ...], reference: bool) -> Any:
            return torch.bmm(inputs[0], inputs[1])

        skew = f"skew {ctx.moe_skew:g}" if ctx.moe_skew > 0 else "balanced"
        layout = "weight first" if weight_first else "token first"
        return Case(
            inputs=inputs,
            run=run_batched_mm,
            note=f"batched_mm: torch.bmm over {pairs} gathered per-pair weights of {experts} experts "
            f"({layout}, {skew} routing; the gather is its own op, run untimed at build)",
        )
