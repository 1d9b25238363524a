"""Which graph op each measured kernel belongs to: the methods, the checks an alignment must pass, the choice.

Two methods give a measured trace's kernels to graph ops, tried in this order:

- **modules** (:mod:`opgraph.compare.modules`): the trace's module ranges and CPU op names, where the
  trace was profiled with a range around every module call;
- **calls** (:mod:`opgraph.compare.align`): per (step, layer) bucket of the trace's analysis, the aten
  calls by order, name and input shapes (shapes need a trace recorded with ``record_shapes``).

An alignment is only used when it passes two checks: the kernels given to ops fit the ops' kinds (GEMM
and attention kernels to GEMM and attention ops, the others to the others: :data:`KIND_MISFIT` of the
attributed time at most), and, for an alignment by calls (whose layer boundaries the analysis inferred;
module ranges name each kernel's layer), every layer's reference time stands in about the same ratio to
its predicted time (:data:`LAYER_SPREAD`), as the layers of one model run the same ops. When neither method
gives a fitting alignment the comparison stays at step, layer and kind; a note says which method was
used, and why the others were not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opgraph.compare.align import Bucket, align_ops, aten_name, hand_over, work_kind
from opgraph.compare.modules import align_by_modules
from opgraph.ir.ops import OpBase, OpCategory
from opgraph.trace.events import GpuEvent, TraceData

BY_CALL = 0.5
"""Share of the graph's aten-call ops that must find their call in the trace for an alignment by calls."""
KIND_MISFIT = 0.1
"""Largest share of the attributed device time an alignment may give to ops of another kind (GEMM or
attention kernels to other ops, or other kernels to GEMM and attention ops)."""
LAYER_SPREAD = 2.0
"""Largest ratio between the layers' (reference / predicted) time in an alignment: the layers of one model
run the same ops, so one layer taking several times its share of the trace means kernels went astray."""
_HEAVY_KERNEL = frozenset({"gemm", "attention"})
ATTRIBUTION_NOTES = ("kernels attributed to ops ", "no alignment of kernels with ops ")
"""How the comparison's note on the method used begins (one of these)."""

Owners = dict[int, list[GpuEvent]]
"""Op id -> the measured device events attributed to it."""


@dataclass
class Attribution:
    """The alignment chosen (``owners`` None: none fit, compare by step, layer and kind) and the notes
    that say which method gave it and why the others did not."""

    method: str | None
    owners: Owners | None
    notes: list[str] = field(default_factory=list)


def misfit(
    owners: Mapping[int, Sequence[GpuEvent]],
    ops: Mapping[int, OpBase],
    predicted: Mapping[int, float],
    layers: bool = True,
) -> str | None:
    """Why an alignment cannot be right (kernels of other kinds, or, with ``layers``, a layer with a share
    of the trace far from its share of the prediction); None when it passes the checks.

    ``ops``: the graph ops by id; ``predicted``: predicted device time by op id. The layer check is for
    alignments whose layer boundaries are inferred (by calls); module ranges name each kernel's layer, and
    a layer's time may legitimately stray (a router that loads fewer experts in one layer, a noisy host).
    """
    total = wrong = 0.0
    worst: dict[int, float] = defaultdict(float)
    for op_id, ks in owners.items():
        heavy_op = ops[op_id].kind in OpCategory.MATMUL
        for g in ks:
            total += g.dur
            if (work_kind(g) in _HEAVY_KERNEL) != heavy_op:
                wrong += g.dur
                worst[op_id] += g.dur
    if total and wrong > KIND_MISFIT * total:
        op_id = max(worst, key=lambda k: worst[k])
        op = ops[op_id]
        return (
            f"{100 * wrong / total:.0f}% of the attributed device time went to ops of another kind (the "
            f"{op.kind.value} op {op_id}, {op.scope or op.target}, got {worst[op_id]:,.1f} us of "
            f"{'other' if op.kind in OpCategory.MATMUL else 'GEMM or attention'} kernels)"
        )
    if not layers:
        return None
    ref: dict[int, float] = defaultdict(float)
    pred: dict[int, float] = defaultdict(float)
    for op_id, ks in owners.items():
        layer = ops[op_id].layer
        if layer is not None:
            ref[layer] += sum(g.dur for g in ks)
            pred[layer] += predicted.get(op_id, 0.0)
    ratios = {k: ref[k] / pred[k] for k in ref if ref[k] > 0 and pred[k] > 0}
    if len(ratios) >= 2:
        lo, hi = min(ratios, key=lambda k: ratios[k]), max(ratios, key=lambda k: ratios[k])
        if ratios[hi] > LAYER_SPREAD * ratios[lo]:
            return (
                f"layer {hi} got {ratios[hi] / ratios[lo]:.1f}x the share of the trace that layer {lo} got, for "
                f"the same predicted share (layer {lo}: {ref[lo]:,.1f} us, layer {hi}: {ref[hi]:,.1f} us)"
            )
    return None


def by_calls(groups: Sequence[Bucket]) -> tuple[Owners, int, int]:
    """Alignment by aten calls within the analysis's (step, layer) buckets: (owners, ops aligned with a
    call of their own, graph ops lowered from an aten call)."""
    owners: Owners = {}
    called: set[int] = set()
    in_time = sorted((b for b in groups if b.kernels), key=lambda b: (b.step, b.kernels[0].ts))
    for b in in_time:
        got, by_call = align_ops(b)
        owners.update(got)
        called |= by_call
    hand_over(in_time, owners)
    named = sum(1 for b in groups for op in b.ops if aten_name(op) is not None)
    return owners, len(called), named


def attribute_ops(groups: Sequence[Bucket], data: TraceData, predicted: Mapping[int, float]) -> Attribution:
    """The measured device events of each graph op of matched steps (``groups``: the (step, layer) buckets
    of graph ops and kernels), by the first method whose alignment passes :func:`misfit`."""
    ops = {op.id: op for b in groups for op in b.ops}
    rejected: list[str] = []
    modules = align_by_modules(groups, data, list(ops.values()))
    if modules is None:
        rejected.append("module ranges: the trace has no range named by a module path of the graph")
    elif not modules.owners:
        rejected.append("module ranges: no kernel lined up with an op")
    else:
        why = misfit(modules.owners, ops, predicted, layers=False)
        if why is None:
            missed = (
                f"; scopes not lined up: {', '.join(modules.unaligned_scopes[:6])}" if modules.unaligned_scopes else ""
            )
            return Attribution(
                "modules",
                modules.owners,
                [
                    "kernels attributed to ops by the trace's module ranges and CPU op names "
                    f"({modules.matched_ops} of {modules.named_ops} ops lowered from an aten call found it{missed})"
                ],
            )
        rejected.append(f"module ranges: {why}")
    owners, called, named = by_calls(groups)
    if not named or called < BY_CALL * named:
        rejected.append(
            f"aten calls: only {called} of {named} graph ops lowered from an aten call found that call in the trace "
            "(kernel-only or CUDA-graph trace?)"
        )
    else:
        why = misfit(owners, ops, predicted)
        if why is None:
            tried = f" (not by {'; '.join(rejected)})" if rejected and modules is not None else ""
            return Attribution(
                "calls",
                owners,
                [f"kernels attributed to ops by aten call order, name and shapes, layer by layer{tried}"],
            )
        rejected.append(f"aten calls: {why}")
    return Attribution(
        None, None, [f"no alignment of kernels with ops fits ({'; '.join(rejected)}): compared by step, layer and kind"]
    )
