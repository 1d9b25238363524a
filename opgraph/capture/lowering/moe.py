"""``moe``: routers become ``MoeRouting(route)``; an experts call becomes dispatch, grouped expert
GEMMs (``moe_grouped_e{E}_h{H}_i{I}_topk{K}_gate_up`` / ``_down``), the gated activation, and combine.

Expert computation on every device is the balanced (or skewed) stand-in of
:mod:`opgraph.capture.moe_model`, so the ops inside an experts call are known: index ops dispatch,
``bmm``/``mm`` are expert GEMMs, and the weighting and sum combine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, float_inputs, last_dim, numel
from opgraph.capture.moe_model import ExpertPlan, is_experts_module
from opgraph.ir.ops import OpKind

_ROUTER_CLASS = re.compile(r"Router|TopkRouter|TopKRouter|MoeGate|MoEGate")
_GEMM = frozenset({"bmm", "mm", "_grouped_mm", "addmm", "baddbmm"})
_DISPATCH = frozenset(
    {
        "index_select",
        "index",
        "gather",
        "arange",
        "floor_divide",
        "div",
        "repeat_interleave",
        "sort",
        "argsort",
        "histc",
        "bincount",
        "cumsum",
        "one_hot",
        "zeros",
        "slice_scatter",
        "cat",
        "_to_copy",
        "clone",
    }
)
_COMBINE = frozenset({"sum", "index_add", "index_add_", "scatter_add", "scatter_add_", "mul"})


@dataclass(frozen=True)
class LowerMoe:
    """Routers and experts of mixture-of-experts layers."""

    name: ClassVar[str] = "moe"

    def run(self, lw: Lowering) -> None:
        expert_calls = [i for i, c in enumerate(lw.calls) if c.module is not None and is_experts_module(c.module)]
        router_calls = [i for i, c in enumerate(lw.calls) if _ROUTER_CLASS.search(c.cls)]
        if not expert_calls and not router_calls:
            return
        members = lw.events_by_call(set(expert_calls) | set(router_calls))
        for call in router_calls:
            self._router(lw, call, members.get(call, []))
        for call in expert_calls:
            self._experts(lw, call, members.get(call, []))

    def _router(self, lw: Lowering, call: int, evs: list[int]) -> None:
        module = lw.calls[call].module
        experts = int(getattr(module, "num_experts", 0) or getattr(module, "n_routed_experts", 0) or 0)
        top_k = int(getattr(module, "top_k", 0) or getattr(module, "num_experts_per_tok", 0) or 0)
        gemm_at = [i for i in evs if lw.events[i].fn in ("mm", "addmm", "linear")]
        # Only what follows the router GEMM is routing; casts before it stay separate ops (no cycle).
        after = gemm_at[-1] if gemm_at else -1
        rest = [i for i in evs if lw.free(i) and i > after]
        if not rest:
            return
        x = next((r for i in evs for r in float_inputs(lw.events[i])), None)
        tokens = numel(x) // last_dim(x) if x else 0
        if not experts:
            logits = next((o for i in evs if lw.events[i].fn in ("mm", "addmm") for o in lw.events[i].outputs), None)
            experts = last_dim(logits) if logits else 1
        topk_ev = next((lw.events[i] for i in rest if lw.events[i].fn == "topk"), None)
        if not top_k and topk_ev is not None and len(topk_ev.args) > 1 and isinstance(topk_ev.args[1], int):
            top_k = topk_ev.args[1]
        lw.claim(
            rest,
            OpKind.MOE_ROUTING,
            {
                "fn": "route",
                "tokens": tokens,
                "experts": experts,
                "top_k": max(1, top_k),
                "hidden": last_dim(x) if x else 1,
            },
            target=lw.calls[call].cls,
            call=call,
        )

    def _experts(self, lw: Lowering, call: int, evs: list[int]) -> None:
        module = lw.calls[call].module
        state = lw.calls[call].state
        plan = state if isinstance(state, ExpertPlan) else ExpertPlan(tokens=0, top_k=1, active=1, impl="loop")
        experts = int(getattr(module, "num_experts", 0) or 1)
        top_k, tokens, active, impl = plan.top_k, plan.tokens, plan.active, plan.impl
        free = [i for i in evs if lw.free(i)]
        gemms = [i for i in free if lw.events[i].fn in _GEMM]
        if not gemms:
            return
        # Expert GEMMs: one grouped op per (n, k) shape family, in order (gate_up, then down).
        families: dict[tuple[int, int], list[int]] = {}
        for i in gemms:
            a, b = lw.events[i].inputs[-2], lw.events[i].inputs[-1]
            families.setdefault((b.shape[-1], a.shape[-1]), []).append(i)
        hidden = lw.events[gemms[0]].inputs[-2].shape[-1]
        first_n = next(iter(families))[0]
        inter = first_n // 2 if getattr(module, "has_gate", True) else first_n
        first_gemm = min(gemms)
        last_gemm = max(gemms)
        disp = [i for i in free if i < first_gemm and lw.events[i].fn not in _GEMM]
        comb = [i for i in free if i > last_gemm and lw.events[i].fn not in _GEMM]
        h = hidden

        def routing(events: list[int], fn: str) -> None:
            if events:
                fields = {"fn": fn, "tokens": tokens, "experts": experts, "top_k": top_k, "hidden": h}
                lw.claim(events, OpKind.MOE_ROUTING, fields, target=f"moe_{fn}", call=call)

        routing(disp, "dispatch")
        for pos, ((n, k), fam) in enumerate(families.items()):
            rows = 0
            for i in fam:
                a = lw.events[i].inputs[-2]
                rows += numel(a) // a.shape[-1]
            groups = max(1, active)
            part = "gate_up" if pos == 0 else "down"
            lw.claim(
                fam,
                OpKind.GEMM,
                {"m": rows // groups, "n": n, "k": k, "groups": groups},
                target=f"moe_experts_{part}",
                call=call,
                flops=2 * rows * n * k,
                definition=f"moe_{impl}_e{experts}_h{h}_i{inter}_topk{top_k}_{part}",
            )
        routing(comb, "combine")
