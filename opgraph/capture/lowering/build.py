"""Build the IR from the lowering groups: one validated op per group, data edges by tensor identity."""

from __future__ import annotations

from typing import Any

from opgraph.capture.lowering.base import FLOAT_DTYPES, FREE, Lowering
from opgraph.capture.recorder import Event, TRef
from opgraph.capture.scopes import layer_of
from opgraph.ir.dtypes import DType
from opgraph.ir.graph import Edge, EdgeKind
from opgraph.ir.ops import OP_TYPES, AtenCall, OpBase, OpKind, Stage
from opgraph.ir.tensor import TensorSpec

_DTYPE_CACHE: dict[str, DType] = {}


def _dtype(name: str) -> DType:
    d = _DTYPE_CACHE.get(name)
    if d is None:
        try:
            d = DType(name)
        except ValueError:
            d = DType.fp32
        _DTYPE_CACHE[name] = d
    return d


def _spec(ref: TRef) -> TensorSpec:
    # Recorded shapes are trusted: skip validation (hot path, thousands of tensors).
    return TensorSpec.model_construct(shape=ref.shape, dtype=_dtype(ref.dtype), strides=ref.strides, id=ref.tid)


def _group_tensors(lw: Lowering, members: list[int]) -> tuple[list[TRef], list[TRef]]:
    evs = [lw.events[m] for m in members]
    if len(evs) == 1:
        return list(evs[0].inputs), list(evs[0].outputs)
    produced: set[int] = set()
    inputs: list[TRef] = []
    seen_in: set[int] = set()
    for ev in evs:
        for r in ev.inputs:
            if r.tid not in produced and r.tid not in seen_in:
                seen_in.add(r.tid)
                inputs.append(r)
        in_tids = {r.tid for r in ev.inputs}
        for r in ev.outputs:
            if ev.mutates or r.tid not in in_tids:
                produced.add(r.tid)
    member_set = set(members)
    outputs: list[TRef] = []
    seen_out: set[int] = set()
    last = evs[-1]
    for ev in evs:
        for r in ev.outputs:
            if r.tid in seen_out or (r.tid in seen_in and not ev.mutates):
                continue
            external = ev is last or any(
                c not in member_set and lw.owner[c] != FREE for c in lw.consumers.get(r.tid, ())
            )
            if external:
                seen_out.add(r.tid)
                outputs.append(r)
    return inputs, outputs


def _compute_dtype(ins: list[TRef], outs: list[TRef]) -> DType:
    for r in ins:
        if r.dtype in FLOAT_DTYPES:
            return _dtype(r.dtype)
    for r in outs:
        if r.dtype in FLOAT_DTYPES:
            return _dtype(r.dtype)
    return DType.fp32


def group_order(lw: Lowering) -> list[int]:
    """Group indices in program order: by their last event, when all their inputs exist."""
    return sorted(range(len(lw.groups)), key=lambda g: lw.groups[g].members[-1])


def build_ops(lw: Lowering, scopes: list[str]) -> tuple[list[OpBase], list[Edge]]:
    """IR ops (ids in program order) and their data edges."""
    order = group_order(lw)
    gid_of = {g: i for i, g in enumerate(order)}
    ops: list[OpBase] = []
    edges: list[Edge] = []
    folded: dict[int, set[int]] = {}

    def owners(p: int) -> set[int]:
        """Groups whose ops produced what event ``p`` wrote: its own group, or for an event folded away
        (an idle expert's zero-row product writing into the call's output) the groups behind its inputs,
        so a dependency through it is kept."""
        if lw.owner[p] >= 0:
            return {lw.owner[p]}
        if p not in folded:
            folded[p] = set()  # a cycle cannot occur (events only read earlier writes); guards recursion
            found: set[int] = set()
            for r in lw.events[p].inputs:
                q = lw.producer.get(r.tid)
                if q is not None and q < p:
                    found |= owners(q)
            folded[p] = found
        return folded[p]

    for new_id, gi in enumerate(order):
        g = lw.groups[gi]
        ins, outs = _group_tensors(lw, g.members)
        if g.input_views:
            ins = [g.input_views.get(r.tid, r) for r in ins]
        if g.outputs is not None:
            outs = list(g.outputs)
        if g.main_outputs is not None:
            outs = outs[: g.main_outputs]
        first: Event = lw.events[g.members[0]]
        scope = scopes[g.call] if g.call >= 0 else ""
        data: dict[str, Any] = dict(g.fields)
        specs = tuple(_spec(r) for r in ins)
        unread = {tid for m in g.members for tid in lw.events[m].written}
        if unread and "bytes_read" not in data:  # an ``out=`` buffer: an input only written, no bytes read
            data["bytes_read"] = sum(t.nbytes for t in specs if t.id not in unread)
        data.update(
            id=new_id,
            target=g.target,
            inputs=specs,
            outputs=tuple(_spec(r) for r in outs),
            scope=scope,
            layer=layer_of(scope),
            stage=Stage(first.stage) if first.stage in ("prefill", "decode") else None,
            step=first.step,
            dtype=_compute_dtype(ins, outs),
        )
        if g.flops is not None:
            data["flops"] = g.flops
        if g.definition:
            data["definition"] = g.definition
        if (len(g.members) == 1 and not first.composite) or (first.composite and len(g.members) == 1):
            data["call"] = AtenCall.model_construct(args=first.args, keywords=first.kwargs)
        ops.append(OP_TYPES[g.kind].model_validate(data))
        seen: set[tuple[int, int]] = set()
        for r in ins:
            p = lw.producer.get(r.tid)
            if p is None:
                continue
            for owner in sorted(owners(p)):
                if owner == gi:
                    continue
                src = gid_of[owner]
                if (src, r.tid) in seen:
                    continue
                seen.add((src, r.tid))
                edges.append(Edge(src=src, dst=new_id, kind=EdgeKind.DATA, tensor=r.tid))
    return ops, edges


__all__ = ["OpKind", "build_ops", "group_order"]
