"""MoE routing replayed as the captured model runs it: softmax in float32, top-k, renormalise; dispatch
(sort the token-expert pairs by expert, gather, count rows into offsets); combine (weight, undo the
sort, sum the top-k rows) as transformers' ``grouped_mm`` experts implementation runs them. A
``masked`` step (:attr:`~opgraph.ir.MoeRouting.masked`: transformers 5.17 masks expert-parallel
sentinel rows on every call) runs the masking calls too, where the model runs them: a dispatch builds
the mask of sorted ids past the last expert, clamps the ids in place and zeroes the masked gathered
rows; a combine zeroes the masked expert rows before weighting them.

Routing follows the graph's assumption: router logits are built so that the top-k experts of each
token are the ones balanced routing (or the recorded skew) assigns, so dispatch and combine see
the expert loads the graph was captured with.
"""

from __future__ import annotations

from typing import Any

from opgraph.ir import MoeRouting, TensorSpec
from validators.inputs import make_tensor, routing_counts, torch_dtype
from validators.recipes.base import BuildContext, Case, Compare, Recipe
from validators.recipes.registry import register_recipe


def assignment(tokens: int, experts: int, top_k: int, skew: float) -> list[list[int]]:
    """Experts of each token (``top_k`` distinct ones) whose loads follow :func:`routing_counts`."""
    counts = routing_counts(tokens, experts, top_k, skew)
    order = sorted(range(experts), key=lambda e: -counts[e])
    picks: list[list[int]] = [[] for _ in range(tokens)]
    left = list(counts)
    t = 0
    # Deal experts to tokens round-robin, heaviest expert first, skipping tokens that already hold it.
    for e in order:
        for _ in range(left[e]):
            for _ in range(tokens):
                if len(picks[t]) < top_k and e not in picks[t]:
                    break
                t = (t + 1) % tokens
            picks[t].append(e)
            t = (t + 1) % tokens
    return picks


@register_recipe(MoeRouting)
class MoeRoutingRecipe(Recipe[MoeRouting]):
    """``route`` (router softmax + top-k + renormalise), ``dispatch`` (gather rows), ``combine`` (weighted sum)."""

    name = "moe_routing"

    def unsupported(self, op: MoeRouting) -> str | None:
        if op.fn not in ("route", "dispatch", "combine"):
            return f"{op.target or op.fn}: no replay recipe for MoE step {op.fn!r}"
        return None

    def build(self, op: MoeRouting, ctx: BuildContext) -> Case:
        import torch

        tokens, experts, top_k = max(op.tokens, 1), op.experts, min(op.top_k, op.experts)
        picks = assignment(tokens, experts, top_k, ctx.moe_skew)
        skew = f"skew {ctx.moe_skew:g}" if ctx.moe_skew > 0 else "balanced"
        if op.fn == "route":
            logits = make_tensor(TensorSpec(shape=(tokens, experts), dtype=op.dtype), ctx.device, ctx.gen) * 0.1
            rows = torch.tensor([t for t, ps in enumerate(picks) for _ in ps], device=ctx.device)
            cols = torch.tensor([e for ps in picks for e in ps], device=ctx.device)
            logits = logits.index_put((rows, cols), torch.full_like(rows, 4, dtype=logits.dtype), accumulate=True)

            def run(inputs: tuple[Any, ...], reference: bool) -> Any:
                (lg,) = inputs
                acc = torch.float64 if reference else torch.float32
                probs = torch.softmax(lg, dim=-1, dtype=acc)
                top, idx = torch.topk(probs, top_k, dim=-1)
                top = top / top.sum(dim=-1, keepdim=True)
                return top.to(lg.dtype), idx

            return Case(inputs=(logits,), run=run, compare=Compare.FLOAT_ONLY, note=f"router, {skew} routing")
        pairs = tokens * top_k
        index = torch.tensor(picks, device=ctx.device, dtype=torch.long)  # (tokens, top_k)
        weights = torch.rand(tokens, top_k, device=ctx.device, generator=ctx.gen).to(torch_dtype(op.weights_dtype))
        masked = op.masked
        if op.fn == "dispatch":
            hidden = make_tensor(TensorSpec(shape=(tokens, op.hidden), dtype=op.dtype), ctx.device, ctx.gen)
            mask_note = ", sentinel mask" if masked else ""

            def run_dispatch(inputs: tuple[Any, ...], reference: bool) -> Any:
                # As transformers' grouped_mm experts: sort the token-expert pairs by expert, gather
                # each pair's token row and routing weight, count the rows per expert into offsets.
                hs, idx, w = inputs
                expert_ids, perm = torch.sort(idx.reshape(-1))
                rows = hs[perm // top_k]
                w_g = w.reshape(-1)[perm]
                counts_in = expert_ids.int() if hs.device.type == "cuda" else expert_ids.float()
                per_expert = torch.histc(counts_in, bins=experts, min=0, max=experts - 1)
                offsets = torch.cumsum(per_expert, dim=0, dtype=torch.int32)
                if not masked:
                    return rows, w_g, offsets
                # Transformers 5.17: mask the sentinel ids (none here), clamp them, zero their rows.
                sentinel = (expert_ids >= experts).unsqueeze(-1)
                expert_ids.clamp_(max=experts - 1)
                rows.masked_fill_(sentinel, 0.0)
                return rows, w_g, offsets, sentinel

            return Case(
                inputs=(hidden, index, weights),
                run=run_dispatch,
                compare=Compare.NONE,
                note=f"sort, gather, histc, cumsum{mask_note} ({skew} routing; equal experts may sort in any order)",
            )
        # Combine as transformers' grouped_mm experts: (5.17: zero the sentinel rows) weight each expert
        # row, undo the sort (inverse permutation, gathered), sum the top-k rows per token, cast back.
        expert_out = make_tensor(TensorSpec(shape=(pairs, op.hidden), dtype=op.dtype), ctx.device, ctx.gen)
        expert_ids, perm = torch.sort(index.reshape(-1), stable=True)
        weights_g = weights.reshape(-1)[perm]
        # The dispatch's sentinel mask (transformers 5.17), an input of the combine as in the model.
        mask = ((expert_ids >= experts).unsqueeze(-1),) if masked else ()

        def run_combine(inputs: tuple[Any, ...], reference: bool) -> Any:
            eo, w, order, *sentinel = inputs
            if sentinel:
                eo = eo.masked_fill(sentinel[0], 0.0)
            weighted = eo * w.unsqueeze(-1)
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(order.numel(), device=order.device)
            return weighted[inverse].view(tokens, top_k, -1).sum(dim=1).to(eo.dtype)

        return Case(
            inputs=(expert_out, weights_g, perm, *mask),
            run=run_combine,
            note=f"{'sentinel mask, ' if masked else ''}weighted, unsorted top-k sum, {skew} routing",
        )
