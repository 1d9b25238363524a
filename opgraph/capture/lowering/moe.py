"""``moe``: routers become ``MoeRouting(route)``; an experts call becomes dispatch, its expert GEMMs
(``moe_{impl}_e{E}_h{H}_i{I}_topk{K}_gate_up`` / ``_down``), the gated activation, and combine.

An expert GEMM's ``expert`` field (:class:`~opgraph.ir.ExpertGemm`) holds what its definition names (the
experts implementation, experts, top-k and projection) and how the host issues it is its ``issue``
field (:class:`~opgraph.ir.HostIssue`): consumers read those, the definition is a name.

An experts call runs the model's own experts implementation (:mod:`opgraph.capture.moe_model`):
the ops before its first GEMM dispatch, those after its last combine. A ``_grouped_mm`` becomes one
grouped GEMM whose groups are the experts that received rows (``m`` their mean rows, from the call's
:class:`~opgraph.capture.moe_model.ExpertPlan`: observed on a real device, modelled on ``meta``); a
per-expert ``mm`` (the eager loop, torch's fallback for dtypes without a grouped kernel) becomes one
GEMM at its own rows, so each small product is costed at its real ``m`` (an idle expert's product,
zero rows, launches nothing and folds away). The fallback's products run nested in one Python-level
``_grouped_mm`` call, its C++ loop issuing them with no Python between: the call's first product
stands for the Python-level call and holds its copy of the offsets to the host (a wait for the device:
``issue`` :attr:`~opgraph.ir.HostIssue.SYNC`, its definition ending with :data:`SYNC_MARK`), the others
are :attr:`~opgraph.ir.HostIssue.NESTED` (their definitions ending with :data:`NESTED_MARK`), so the host
model charges them no framework time. The eager loop's products are Python-level calls. A
grouped GEMM moves the weights of the experts that received rows only: its bytes count those, not the
whole stacked weight tensor it was handed.

transformers' ``batched_mm`` experts gather each token-expert pair's expert weights (an ``index`` of the
stacked weights by the routed ids, a memory op of its own: a copy of the weights, not routing) and run
one ``bmm`` per projection over the pairs, each pair's token against its own weight copy: a ``Gemm`` of
``batch`` = pairs, ``m`` = 1 and the projection's ``n``/``k`` (the kernel's ``[n, k] @ [k, 1]`` is the
transpose of that ``[1, k] @ [k, n]``), whose bytes are the gathered copies it reads.

A dispatch or combine that claims the masking of expert-parallel sentinel rows (``masked_fill``,
transformers 5.17's ``grouped_mm`` experts on every call) is ``masked``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from opgraph.capture.lowering.base import Lowering, float_inputs, last_dim, numel
from opgraph.capture.moe_model import ExpertPlan, is_experts_module, resolve_plan
from opgraph.capture.recorder import Event
from opgraph.ir.dtypes import DType
from opgraph.ir.experts import ExpertGemm, ExpertPart, ExpertsImpl
from opgraph.ir.issue import NESTED_MARK, SYNC_MARK, HostIssue
from opgraph.ir.ops import OpKind

_ROUTER_CLASS = re.compile(r"Router|TopkRouter|TopKRouter|MoeGate|MoEGate")
_GEMM = frozenset({"bmm", "mm", "_grouped_mm", "grouped_mm", "addmm", "baddbmm"})
_GROUPED = frozenset({"_grouped_mm", "grouped_mm"})
_BATCHED = frozenset({"bmm", "baddbmm"})
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
_MASK = frozenset({"masked_fill", "masked_fill_"})
"""The calls that mask expert-parallel sentinel rows (transformers 5.17's ``grouped_mm`` experts on
every call, later ones under expert parallelism only): a routing step that claims one is ``masked``."""
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
        plan = resolve_plan(lw.calls[call].state)
        experts = int(getattr(module, "num_experts", 0) or 1)
        free = [i for i in evs if lw.free(i)]
        gemms = [i for i in free if lw.events[i].fn in _GEMM]
        if not gemms:
            return
        shapes = {i: _gemm_shape(lw.events[i]) for i in gemms}
        if plan is None:  # no routing known (an experts module run outside install): even loads
            rows = shapes[gemms[0]].rows
            plan = ExpertPlan(rows, 1, tuple([max(1, rows // experts)] * experts), "balanced", "unknown")
        top_k, tokens, impl = plan.top_k, plan.tokens, plan.impl
        # Expert GEMMs by (n, k) shape family, in order: gate_up (or up), then down.
        families: dict[tuple[int, int], list[int]] = {}
        for i in gemms:
            families.setdefault((shapes[i].n, shapes[i].k), []).append(i)
        first_n, h = next(iter(families))
        inter = first_n // 2 if getattr(module, "has_gate", True) else first_n
        first_gemm = min(gemms)
        last_gemm = max(gemms)
        # torch's fallback (the per-expert products of a grouped_mm call) starts each call by copying
        # the offsets to the host, which waits for the device: that copy goes with the call's first product.
        fallback = impl == "grouped_mm"
        starts: dict[int, list[int]] = {}
        if fallback:
            previous = -1
            for fam in families.values():
                head = [i for i in fam if lw.events[i].fn not in _GROUPED]
                if head:
                    starts[head[0]] = _offsets_copies(lw, free, previous, head[0], experts)
                previous = max(fam)
        claimed = {i for evs in starts.values() for i in evs}
        # batched_mm's gathers of the expert weights are copies of weights, not routing: memory ops.
        claimed |= _weight_gathers(lw, free, experts)
        disp = [i for i in free if i < first_gemm and lw.events[i].fn not in _GEMM and i not in claimed]
        comb = [i for i in free if i > last_gemm and lw.events[i].fn not in _GEMM]

        def routing(events: list[int], fn: str) -> None:
            if events:
                fields = {"fn": fn, "tokens": tokens, "experts": experts, "top_k": top_k, "hidden": h}
                if any(lw.events[i].fn in _MASK for i in events):  # sentinel rows masked (transformers 5.17)
                    fields["masked"] = True
                lw.claim(events, OpKind.MOE_ROUTING, fields, target=f"moe_{fn}", call=call)

        routing(disp, "dispatch")
        for pos, ((n, k), fam) in enumerate(families.items()):
            part = "gate_up" if pos == 0 else "down"
            definition = f"moe_{impl}_e{experts}_h{h}_i{inter}_topk{top_k}_{part}"
            expert = ExpertGemm(
                impl=ExpertsImpl.named(impl), experts=max(1, experts), top_k=max(1, top_k), part=ExpertPart(part)
            )
            grouped = [i for i in fam if lw.events[i].fn in _GROUPED]
            if grouped:
                # One grouped kernel per call: its groups are the experts that received rows.
                active = max(1, plan.active)
                for i in grouped:
                    rows = min(shapes[i].rows, sum(plan.counts))
                    lw.claim(
                        [i],
                        OpKind.GEMM,
                        {
                            "m": sum(plan.counts) // active,
                            "n": n,
                            "k": k,
                            "groups": active,
                            "expert": expert,
                            **_grouped_bytes(lw.events[i], rows, active, n, k),
                        },
                        target=f"moe_experts_{part}",
                        call=call,
                        flops=2 * rows * n * k,
                        definition=definition,
                    )
            # batched_mm: one product per token-expert pair, each on its own gathered weight copy.
            batched = [i for i in fam if lw.events[i].fn in _BATCHED]
            for i in batched:
                s = shapes[i]
                lw.claim(
                    [i],
                    OpKind.GEMM,
                    {"m": s.m, "n": n, "k": k, "batch": s.batch, "expert": expert},
                    target=f"moe_experts_{part}",
                    call=call,
                    flops=2 * s.batch * s.m * n * k,
                    definition=definition,
                )
            # Per-expert products (the eager loop, torch's fallback): one op per call, at its own rows.
            # The fallback's run in one Python-level ``_grouped_mm`` call: its first product stands for
            # the call (with the offsets copy, a host sync), C++ issues the others (nested).
            pending: list[int] = []
            entry = True
            for i in fam:
                if i in grouped or i in batched:
                    continue
                pending += starts.get(i, [])
                rows = shapes[i].rows
                if rows == 0:  # an idle expert's product in torch's fallback: a call, no kernel
                    lw.fold(i)
                    continue
                issue = HostIssue.CALL
                if fallback:
                    issue = (HostIssue.SYNC if pending else HostIssue.CALL) if entry else HostIssue.NESTED
                mark = {HostIssue.SYNC: SYNC_MARK, HostIssue.NESTED: NESTED_MARK}.get(issue, "")
                lw.claim(
                    [*pending, i],
                    OpKind.GEMM,
                    {"m": rows, "n": n, "k": k, "expert": expert, "issue": issue},
                    target=f"moe_experts_{part}",
                    call=call,
                    flops=2 * rows * n * k,
                    definition=definition + mark,
                )
                pending, entry = [], False
        routing(comb, "combine")


def _weight_gathers(lw: Lowering, free: list[int], experts: int) -> set[int]:
    """batched_mm's gathers of the stacked expert weights by the routed ids (``gate_up_proj[expert_ids]``):
    an ``index`` of a rank-3 tensor no event produced (a parameter) whose leading dimension is the experts.
    (The per-row bias gathers, rank 2, stay where they were: in the dispatch of both implementations.)"""
    out = set()
    for i in free:
        ev = lw.events[i]
        if ev.fn == "index" and ev.inputs:
            src = ev.inputs[0]
            if src.tid not in lw.producer and len(src.shape) == 3 and src.shape[0] == experts:
                out.add(i)
    return out


def _offsets_copies(lw: Lowering, free: list[int], after: int, before: int, experts: int) -> list[int]:
    """The fallback's copy of a grouped call's offsets to the host (``_to_copy`` of the integer
    ``[experts]`` offsets) among the free events strictly between ``after`` and ``before``."""
    out = []
    for i in free:
        ev = lw.events[i]
        if after < i < before and ev.fn == "_to_copy" and len(ev.inputs) == 1:
            t = ev.inputs[0]
            if t.shape == (experts,) and t.dtype in ("int32", "int64"):
                out.append(i)
    return out[-1:]


def _grouped_bytes(ev: Event, rows: int, active: int, n: int, k: int) -> dict[str, int]:
    """Bytes a grouped expert GEMM moves: the routed rows in and out, and the weights of the experts
    that received rows only. The recorded weight operand holds every expert, but the kernel reads
    none of an idle expert's (no rows, no tiles): a decode that routes 64 token-expert pairs to 64
    of 128 experts reads half the weights the whole tensor holds."""
    a, w, *rest = ev.inputs
    out = ev.outputs[0] if ev.outputs else a
    offsets = sum(numel(r) * _itemsize(r.dtype) for r in rest)
    return {
        "bytes_read": int(rows * k * _itemsize(a.dtype) + active * k * n * _itemsize(w.dtype) + offsets),
        "bytes_written": int(rows * n * _itemsize(out.dtype)),
    }


def _itemsize(name: str) -> float:
    try:
        return DType(name).itemsize
    except ValueError:  # a type the IR lacks: count it as fp32
        return 4.0


@dataclass(frozen=True)
class _Product:
    """The shape of an expert GEMM event: ``batch`` products of ``(m x k) @ (k x n)``."""

    batch: int
    m: int
    n: int
    k: int

    @property
    def rows(self) -> int:
        """Rows of all products together (of all groups, for a grouped GEMM)."""
        return self.batch * self.m


def _gemm_shape(ev: Event) -> _Product:
    """The shape of an expert GEMM event (a grouped GEMM's ``m``: the rows of all its groups)."""
    if ev.fn in _GROUPED:  # (S, k) @ (E, k, n) with offsets
        a, w = ev.inputs[0], ev.inputs[1]
        return _Product(1, numel(a) // a.shape[-1], w.shape[-1], w.shape[-2])
    a, b = ev.inputs[0], ev.inputs[1]
    if ev.fn in ("addmm", "baddbmm"):
        a, b = ev.inputs[1], ev.inputs[2]
    if ev.fn in _BATCHED and len(a.shape) == 3:
        batch, p, q = a.shape
        r = b.shape[-1]
        if r == 1 < p:
            # batched_mm's weight-first layout: each pair's [n, k] weight @ its [k, 1] token, the
            # transpose of the token's [1, k] @ [k, n] product (m = 1, n = p).
            return _Product(batch, 1, p, q)
        return _Product(batch, p, r, q)
    return _Product(1, numel(a) // a.shape[-1], b.shape[-1], a.shape[-1])
