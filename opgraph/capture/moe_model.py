"""Expert routing as the model runs it: observed on a real device, modelled (balanced or skewed) on ``meta``.

transformers (5.x) runs a stacked-experts module (``gate_up_proj``/``down_proj`` of rank 3, under
``@use_experts_implementation``) through its configured experts implementation, by default
``grouped_mm``: sort the token-expert pairs by expert, gather the tokens, ``histc``/``cumsum`` the
loads into offsets, one ``_grouped_mm`` per projection (a bf16 kernel on CUDA; for fp16/fp32 the
aten fallback launches one ``mm`` per expert that received tokens), the gate, the routing weights,
the inverse permutation and a ``sum`` over the top-k. :func:`install` keeps that forward:

- on a real device (cpu, cuda) without ``moe_skew``, the module runs **unmodified**; the routing
  indices it was given are kept and, after the run, become the observed tokens per expert of each call
  (:func:`resolve_plan`). A ``_grouped_mm`` of a dtype without a GPU grouped kernel is recorded as
  torch's fallback runs it (one ``mm`` per expert at its observed rows; same values), on a GPU and on
  the CPU (which runs that fallback itself): a CPU capture of given weights (``--weights``, or ``--seed``
  for random ones) holds the routing they give without a GPU (a GPU rounds the same forward otherwise,
  so a near tie may route to another expert there);
- with ``moe_skew`` (``0``: balanced), or on ``meta`` (where routing cannot be computed; balanced by
  default), the routing indices are replaced by indices that realise the modelled loads
  (:func:`expert_counts`) and the module's own forward runs with them. On ``meta``, a ``_grouped_mm``
  the device would not run as one kernel (a dtype other than bf16) is emitted as torch's fallback runs
  it: one ``mm`` per expert that received tokens, at its own rows. An experts implementation whose
  control flow depends on the data (``eager``: a Python loop over the experts hit) runs as
  :func:`modelled_experts_forward` on ``meta``, one ``mm`` pair per expert at its modelled rows.

The values are not those of the model when routing is modelled; shapes, FLOPs and bytes are those of
the chosen routing, and the graph states which routing it holds (the assumption texts below).
"""

from __future__ import annotations

import contextlib
import math
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

FALLBACK_DEVICES: tuple[str, ...] = ("cuda", "cpu")
"""Real device types whose ``_grouped_mm`` runs torch's per-expert fallback for dtypes without a GPU
grouped kernel (:func:`runs_per_expert`), recorded as the products it launches. A CUDA device does; the
CPU runs that fallback for every dtype, so a CPU capture (the model's real routing without a GPU)
records an fp16 call as a GPU runs it too, and a bf16 call as the GPU's one grouped kernel; ``meta``
models a GPU."""
PLAN_ATTR = "_opgraph_plan"
"""Attribute an experts module sets during its forward; the recorder keeps it on the module call."""
LAYER_ATTR = "_opgraph_layer"
"""Attribute :func:`install` sets on an experts module: its layer (the ops' ``layer``), which modelled
routing realises the expected active experts over (:func:`expected_active`)."""

Routing = Literal["balanced", "skewed", "observed"]


@dataclass(frozen=True)
class ExpertPlan:
    """How one call of a stacked-experts module routed its tokens (read by the ``moe`` pass)."""

    tokens: int
    """Tokens routed."""
    top_k: int
    """Experts per token."""
    counts: tuple[int, ...]
    """Rows of each expert that received tokens, in expert order (idle experts left out)."""
    routing: Routing
    """Where the counts come from: modelled (balanced, skewed) or observed in the run."""
    impl: str
    """The experts implementation that ran (``grouped_mm``, ``batched_mm``, ``eager``, ``modelled``)."""

    @property
    def active(self) -> int:
        """Experts that received at least one token."""
        return len(self.counts)


@dataclass(frozen=True)
class _Observed:
    """The routing indices one call was given; turned into an :class:`ExpertPlan` after the run."""

    top_k_index: Any
    experts: int
    impl: str


BALANCED_ASSUMPTION = (
    "MoE routing is modelled, not computed: token-expert pairs are spread evenly (balanced) over as many "
    "experts as a router that picks each token's experts uniformly reaches in expectation "
    "(E(1 - (1 - k/E)^T) of E experts for T tokens picking k each); expert outputs are not numerically "
    "those of the model"
)
OBSERVED_ASSUMPTION = (
    "MoE routing is the model's own (unmodified router): the tokens per expert of each call are those "
    "observed in the captured run"
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


def routing_assumption(skew: float | None, device: str) -> str:
    """What a capture on ``device`` with ``moe_skew=skew`` assumes about MoE routing."""
    if skew is None and device != "meta":
        return OBSERVED_ASSUMPTION
    return skew_assumption(skew) if skew else BALANCED_ASSUMPTION


def expected_active(experts: int, tokens: int, top_k: int, layer: int = 0) -> int:
    """Experts that ``tokens`` tokens reach in layer ``layer`` when each picks ``top_k`` distinct experts
    uniformly. A few decode tokens collide on experts: they reach ``x = E (1 - (1 - k/E)^T)`` in
    expectation (8 tokens picking 8 of 128: 51.6, not 64); a prefill reaches them all.

    ``x`` is realised over the layers rather than rounded in each: layer ``l`` gets
    ``round((l + 1) x) - round(l x)`` (halves up), so layers ``0..l`` together reach ``(l + 1) x`` within
    a half. Rounding each layer alone would miss by up to half an expert in every layer: 4 tokens picking
    2 of 8 reach 5.47, which is 5 in every layer (9% fewer expert weights read than expected), and
    5, 6, 5, 6, ... here.

    >>> expected_active(128, 8, 8), expected_active(128, 1, 8), expected_active(8, 2048, 2)
    (52, 8, 8)
    >>> [expected_active(8, 4, 2, layer) for layer in range(4)]
    [5, 6, 5, 6]
    """
    if tokens <= 0 or top_k <= 0:
        return 0
    k = min(top_k, experts)
    reached = experts * (1.0 - (1.0 - k / experts) ** tokens)
    first = max(layer, 0)
    share = math.floor((first + 1) * reached + 0.5) - math.floor(first * reached + 0.5)
    return min(experts, max(k, share))


def expert_counts(pairs: int, experts: int, tokens: int, skew: float = 0.0, layer: int = 0) -> list[int]:
    """Rows per active expert for ``pairs`` token-expert pairs, busiest first; no expert exceeds ``tokens``.
    Balanced (``skew`` 0): spread evenly over the :func:`expected_active` experts of layer ``layer``;
    skewed: over all experts by a Zipf law of exponent ``skew``.

    >>> expert_counts(64, 128, 8)[:14], len(expert_counts(64, 128, 8))
    ([2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1], 52)
    >>> expert_counts(4, 8, 1)
    [1, 1, 1, 1]
    >>> expert_counts(4096, 8, 2048)
    [512, 512, 512, 512, 512, 512, 512, 512]
    """
    if pairs <= 0:
        return []
    if skew:
        weights = [(e + 1) ** (-skew) for e in range(experts)]
    else:
        active = expected_active(experts, tokens, pairs // max(tokens, 1), layer)
        weights = [1.0 if e < active else 0.0 for e in range(experts)]
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


def counts_by_expert(counts: list[int], experts: int) -> list[int]:
    """Modelled loads (busiest first) laid over experts ``0..active-1``; idle experts get 0.

    >>> counts_by_expert([3, 1], 4)
    [3, 1, 0, 0]
    """
    return [*counts, *([0] * (experts - len(counts)))][:experts]


def routing_indices(loads: list[int], tokens: int, top_k: int) -> list[list[int]]:
    """Top-k expert indices per token that realise ``loads`` (rows per expert, in expert order).

    Pair ``p`` of the expert-sorted sequence goes to token ``p % tokens``: no load exceeds ``tokens``,
    so a token never picks the same expert twice.

    >>> routing_indices([2, 1, 1], 2, 2)
    [[0, 1], [0, 2]]
    """
    seq = [e for e, c in enumerate(loads) for _ in range(c)]
    return [[seq[t + j * tokens] for j in range(top_k)] for t in range(tokens)]


@contextlib.contextmanager
def _unrecorded() -> Iterator[None]:
    """Run torch calls that are no part of the model outside any dispatch mode (the recorder's)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def _impl(module: Any) -> str:
    config = getattr(module, "config", None)
    return str(getattr(config, "_experts_implementation", None) or "eager")


def _per_expert_grouped_mm(loads: list[int]) -> Any:
    """``_grouped_mm`` as torch's fallback runs it for dtypes without a grouped kernel
    (``_grouped_mm_fallback`` of ATen): an output allocated once, the offsets copied to the host, then
    one ``mm`` into the output per expert in expert order, idle experts included (zero rows: a call,
    no kernel). ``loads``: rows per expert, the offsets' values."""
    import torch

    def grouped_mm(input: Any, weight: Any, offs: Any) -> Any:
        x = input.to(weight.dtype)
        rows, n = x.shape[0], weight.shape[-1]
        out = torch.empty_strided((rows, n), (n, 1), dtype=x.dtype, device=x.device)
        offs.to(offs.device, copy=True)  # the device-to-host copy of the offsets (a sync on a GPU)
        start = 0
        for e in range(weight.shape[0]):
            c = loads[e] if e < len(loads) else 0
            torch.mm(x[start : start + c], weight[e], out=out[start : start + c])
            start += c
        return out

    return grouped_mm


def runs_per_expert(module: Any, dtype: Any) -> bool:
    """Whether a GPU runs ``module``'s experts as torch's per-expert fallback of ``_grouped_mm``: its
    experts implementation is ``grouped_mm`` and ``dtype`` has no grouped kernel (only bf16 has one)."""
    import torch

    return _impl(module) == "grouped_mm" and dtype != torch.bfloat16


@contextlib.contextmanager
def _grouped_mm_as_device_runs(module: Any, dtype: Any, loads: list[int]) -> Iterator[None]:
    """Swap transformers' ``_grouped_mm`` for the per-expert fallback a GPU runs when
    :func:`runs_per_expert` (on ``meta``, and for observed routing on a :data:`FALLBACK_DEVICES` device);
    otherwise the module runs as written."""
    try:
        from transformers.integrations import moe as hf_moe
    except ImportError:  # pragma: no cover - transformers without experts implementations
        yield
        return
    original = getattr(hf_moe, "_grouped_mm", None)
    if original is None or not runs_per_expert(module, dtype):
        yield
        return
    hf_moe._grouped_mm = _per_expert_grouped_mm(loads)
    try:
        yield
    finally:
        hf_moe._grouped_mm = original


def _up_weight(module: Any) -> Any:
    """The stacked first-projection weights of an experts module (``gate_up_proj``, or ``up_proj``)."""
    return module.gate_up_proj if getattr(module, "has_gate", True) else module.up_proj


def _observed_loads(top_k_index: Any, experts: int) -> list[int]:
    """Rows per expert (in expert order) of a call's routing indices, counted outside the recording."""
    import torch

    with _unrecorded():
        flat = top_k_index.reshape(-1).to("cpu")
        return [int(c) for c in torch.bincount(flat[(flat >= 0) & (flat < experts)], minlength=experts).tolist()]


def routed_experts_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The module's own forward with modelled routing: indices that realise the modelled loads."""
    import torch

    tokens, top_k = hidden_states.shape[0], top_k_index.shape[-1]
    experts = int(self.num_experts)
    skew = float(getattr(self, "_opgraph_skew", 0.0))
    layer = int(getattr(self, LAYER_ATTR, 0))
    loads = counts_by_expert(expert_counts(tokens * top_k, experts, tokens, skew, layer), experts)
    routing: Routing = "skewed" if skew else "balanced"
    impl = _impl(self)
    meta = hidden_states.device.type == "meta"
    if meta and impl not in ("grouped_mm", "batched_mm"):
        return modelled_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    if not meta:
        # The router's own index tensor takes the modelled values (unrecorded: the model keeps its
        # data flow, and the run launches nothing the model does not).
        with _unrecorded():
            top_k_index.copy_(torch.tensor(routing_indices(loads, tokens, top_k), dtype=top_k_index.dtype))
    setattr(self, PLAN_ATTR, ExpertPlan(tokens, top_k, tuple(c for c in loads if c), routing, impl))
    weight = _up_weight(self)
    with _grouped_mm_as_device_runs(self, weight.dtype, loads) if meta else contextlib.nullcontext():
        return type(self).forward(self, hidden_states, top_k_index, top_k_weights)


def observed_experts_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The module's own forward, unmodified; the routing indices are kept for :func:`resolve_plan`.

    On a GPU or the CPU, a ``_grouped_mm`` of a dtype without a GPU grouped kernel runs as torch's
    fallback does (one ``mm`` per expert at its observed rows, :func:`_grouped_mm_as_device_runs`), so the
    graph holds the products a GPU launches rather than one grouped kernel it never runs; the values are
    the same."""
    setattr(self, PLAN_ATTR, _Observed(top_k_index, int(self.num_experts), _impl(self)))
    weight = _up_weight(self)
    if hidden_states.device.type not in FALLBACK_DEVICES or not runs_per_expert(self, weight.dtype):
        return type(self).forward(self, hidden_states, top_k_index, top_k_weights)
    loads = _observed_loads(top_k_index, int(self.num_experts))  # the fallback copies the offsets too: no extra wait
    with _grouped_mm_as_device_runs(self, weight.dtype, loads):
        return type(self).forward(self, hidden_states, top_k_index, top_k_weights)


def resolve_plan(state: object) -> ExpertPlan | None:
    """The :class:`ExpertPlan` of one experts call from what its module left (observed counts are
    counted here, after the run, so the run itself launches nothing extra)."""
    if isinstance(state, ExpertPlan):
        return state
    if not isinstance(state, _Observed) or state.top_k_index.device.type == "meta":
        return None
    loads = _observed_loads(state.top_k_index, state.experts)
    idx = state.top_k_index
    tokens = int(idx.shape[0]) if idx.ndim > 1 else int(idx.numel())
    return ExpertPlan(tokens, int(idx.shape[-1]), tuple(c for c in loads if c), "observed", state.impl)


def modelled_experts_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """A per-expert loop with modelled loads, for ``meta`` where the module's own loop cannot run (its
    trip count depends on the data): one ``mm`` pair per expert that receives tokens, at its rows."""
    import torch

    tokens, hidden = hidden_states.shape[0], hidden_states.shape[-1]
    top_k = top_k_index.shape[-1]
    experts = int(self.num_experts)
    skew = float(getattr(self, "_opgraph_skew", 0.0))
    counts = expert_counts(tokens * top_k, experts, tokens, skew, int(getattr(self, LAYER_ATTR, 0)))
    pairs = sum(counts)
    setattr(self, PLAN_ATTR, ExpertPlan(tokens, top_k, tuple(counts), "skewed" if skew else "balanced", "modelled"))
    device = hidden_states.device
    has_gate = getattr(self, "has_gate", True)
    transposed = getattr(self, "is_transposed", False)
    has_bias = getattr(self, "has_bias", False)
    up_w = _up_weight(self)
    up_b = (self.gate_up_proj_bias if has_gate else self.up_proj_bias) if has_bias else None
    down_b = self.down_proj_bias if has_bias else None
    # Dispatch: copy each token once per chosen expert, grouped by expert.
    order = torch.arange(pairs, device=device) // top_k
    x = hidden_states.index_select(0, order)

    def gate(h: Any) -> Any:
        return self._apply_gate(h) if has_gate else self.act_fn(h)

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


def install(model: Any, skew: float | None = None, device: str = "meta") -> str | None:
    """Prepare every stacked-experts module of ``model`` for capture; returns the routing assumption.

    On a real ``device`` with ``skew`` unset the modules run unmodified and their observed routing is
    kept; otherwise they run with modelled routing (balanced, or Zipf-skewed with ``skew`` > 0).
    ``None`` when the model has no such module.
    """
    from opgraph.capture.scopes import layer_of

    observed = skew is None and device != "meta"
    n = 0
    for name, module in model.named_modules():
        if is_experts_module(module) and hasattr(module, "num_experts") and hasattr(module, "down_proj"):
            forward = observed_experts_forward if observed else routed_experts_forward
            module.forward = types.MethodType(forward, module)
            module._opgraph_skew = skew or 0.0
            setattr(module, LAYER_ATTR, layer_of(name) or 0)
            n += 1
    return routing_assumption(skew, device) if n else None
