"""Modelled expert routing: which experts get how many tokens, on any device, with no data dependence.

Real routing depends on the weights (random on meta/cpu) and is not computable on ``meta``. The
experts modules of transformers (``gate_up_proj``/``down_proj`` stacked per expert) are therefore run
by :func:`modelled_experts_forward`: the router still runs as written, but the token-to-expert counts
come from :func:`expert_counts` — balanced by default (every token-expert pair spread evenly), or
Zipf-skewed with ``skew`` > 0. Balanced counts that divide evenly run as one ``bmm`` over the active
experts; uneven counts run one ``mm`` per active expert (as the eager HF loop does). The values are
not those of the model; the shapes, FLOPs and bytes are those of the chosen routing.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Literal

PLAN_ATTR = "_opgraph_plan"
"""Attribute an experts module sets during its forward; the recorder keeps it on the module call."""


@dataclass(frozen=True)
class ExpertPlan:
    """How one call of a stacked-experts module ran its modelled routing (read by the ``moe`` pass)."""

    tokens: int
    """Tokens routed."""
    top_k: int
    """Experts per token."""
    active: int
    """Experts that received at least one token."""
    impl: Literal["bmm", "loop"]
    """One ``bmm`` over equal loads, or one ``mm`` per expert."""


BALANCED_ASSUMPTION = (
    "MoE routing is modelled, not computed: token-expert pairs are spread evenly over the experts "
    "(balanced); expert outputs are not numerically those of the model"
)


def is_experts_module(module: object) -> bool:
    """Whether a module holds stacked expert weights (``gate_up_proj``/``up_proj`` of rank 3)."""
    for attr in ("gate_up_proj", "up_proj"):
        w = getattr(module, attr, None)
        if w is not None and getattr(w, "ndim", 0) == 3:
            return True
    return False


def skew_assumption(skew: float) -> str:
    """The assumption text for a skewed routing."""
    return (
        f"MoE routing is modelled, not computed: expert loads follow a Zipf law of exponent {skew:g} "
        "(the busiest expert first); expert outputs are not numerically those of the model"
    )


def expert_counts(pairs: int, experts: int, tokens: int, skew: float = 0.0) -> list[int]:
    """Rows per active expert for ``pairs`` token-expert pairs, busiest first; no expert exceeds ``tokens``.

    >>> expert_counts(16, 8, 8)
    [2, 2, 2, 2, 2, 2, 2, 2]
    >>> expert_counts(4, 8, 1)
    [1, 1, 1, 1]
    """
    if pairs <= 0:
        return []
    weights = [(e + 1) ** (-skew) for e in range(experts)]
    total_w = sum(weights)
    raw = [pairs * w / total_w for w in weights]
    counts = [int(r) for r in raw]
    rem = pairs - sum(counts)
    for e in sorted(range(experts), key=lambda e: (-(raw[e] - counts[e]), e))[:rem]:
        counts[e] += 1
    # A token picks distinct experts, so one expert takes each token at most once.
    cap = max(tokens, 1)
    spill = 0
    for e in range(experts):
        if counts[e] > cap:
            spill += counts[e] - cap
            counts[e] = cap
    e = 0
    while spill and e < experts:
        room = cap - counts[e]
        take = min(room, spill)
        counts[e] += take
        spill -= take
        e += 1
    return sorted((c for c in counts if c > 0), reverse=True)


def modelled_experts_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """Forward of a stacked-experts module with modelled routing (see the module docstring)."""
    import torch

    tokens, hidden = hidden_states.shape[0], hidden_states.shape[-1]
    top_k = top_k_index.shape[-1]
    experts = int(self.num_experts)
    skew = float(getattr(self, "_opgraph_skew", 0.0))
    counts = expert_counts(tokens * top_k, experts, tokens, skew)
    pairs = sum(counts)
    active = len(counts)
    even = bool(counts) and all(c == counts[0] for c in counts)
    setattr(self, PLAN_ATTR, ExpertPlan(tokens, top_k, active, "bmm" if even else "loop"))
    device = hidden_states.device
    has_gate = getattr(self, "has_gate", True)
    transposed = getattr(self, "is_transposed", False)
    has_bias = getattr(self, "has_bias", False)
    up_w = self.gate_up_proj if has_gate else self.up_proj
    up_b = (self.gate_up_proj_bias if has_gate else self.up_proj_bias) if has_bias else None
    down_b = self.down_proj_bias if has_bias else None
    # Dispatch: copy each token once per chosen expert, grouped by expert.
    order = torch.arange(pairs, device=device) // top_k
    x = hidden_states.index_select(0, order)

    def gate(h: Any) -> Any:
        return self._apply_gate(h) if has_gate else self.act_fn(h)

    if even:
        c = counts[0]
        xg = x.view(active, c, hidden)
        w1 = up_w[:active] if transposed else up_w[:active].transpose(1, 2)
        h = torch.bmm(xg, w1)
        if up_b is not None:
            h = h + up_b[:active].unsqueeze(1)
        h = gate(h)
        w2 = self.down_proj[:active] if transposed else self.down_proj[:active].transpose(1, 2)
        y = torch.bmm(h, w2)
        if down_b is not None:
            y = y + down_b[:active].unsqueeze(1)
        y = y.reshape(pairs, hidden)
    else:
        outs = []
        start = 0
        for e, c in enumerate(counts):
            xe = x[start : start + c]
            start += c
            w1 = up_w[e] if transposed else up_w[e].t()
            h = torch.mm(xe, w1)
            if up_b is not None:
                h = h + up_b[e]
            h = gate(h)
            w2 = self.down_proj[e] if transposed else self.down_proj[e].t()
            ye = torch.mm(h, w2)
            if down_b is not None:
                ye = ye + down_b[e]
            outs.append(ye)
        y = torch.cat(outs, dim=0)
    # Combine: weight each expert output by its routing weight and sum the top-k per token.
    if pairs < tokens * top_k:
        y = torch.cat([y, y.new_zeros(tokens * top_k - pairs, hidden)], dim=0)
    y = y * top_k_weights.reshape(-1, 1).to(y.dtype)
    out = y.view(tokens, top_k, hidden).sum(dim=1)
    return out.to(hidden_states.dtype)


def install(model: Any, skew: float = 0.0) -> int:
    """Run every stacked-experts module of ``model`` with modelled routing; returns how many."""

    n = 0
    for module in model.modules():
        if is_experts_module(module) and hasattr(module, "num_experts") and hasattr(module, "down_proj"):
            module.forward = types.MethodType(modelled_experts_forward, module)
            module._opgraph_skew = skew
            n += 1
    return n
