"""MoE routing replayed as the captured model runs it: softmax in float32, top-k, renormalise; dispatch; combine.

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
        pairs = sum(len(ps) for ps in picks)
        if op.fn == "dispatch":
            hidden = make_tensor(TensorSpec(shape=(tokens, op.hidden), dtype=op.dtype), ctx.device, ctx.gen)

            def run_dispatch(inputs: tuple[Any, ...], reference: bool) -> Any:
                # The calls the captured experts make (arange, floor_divide, index_select): each
                # token's row once per chosen expert.
                (hs,) = inputs
                return hs.index_select(0, torch.arange(pairs, device=hs.device) // top_k)

            return Case(inputs=(hidden,), run=run_dispatch, note=f"gather, {skew} routing")
        # Combine as the captured experts do: weight each expert row, then sum the top-k rows per token.
        expert_out = make_tensor(TensorSpec(shape=(pairs, op.hidden), dtype=op.dtype), ctx.device, ctx.gen)
        weights = torch.rand(pairs, 1, device=ctx.device, generator=ctx.gen).to(torch_dtype(op.dtype))

        def run_combine(inputs: tuple[Any, ...], reference: bool) -> Any:
            eo, w = inputs
            return (eo * w).view(tokens, top_k, -1).sum(dim=1)

        return Case(inputs=(expert_out, weights), run=run_combine, note=f"weighted top-k sum, {skew} routing")
