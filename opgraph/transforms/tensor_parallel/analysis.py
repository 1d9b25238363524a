"""Facts about the unsharded graph gathered before the rewrite: head counts, K/V split factors and the
expert weight gathers of ``batched_mm`` experts (split inside the experts, or by expert)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from opgraph.ir import Attention, Gemm, Memory, OpBase, OpGraph, OpKind, TensorSpec
from opgraph.ir.experts import ExpertsImpl
from opgraph.transforms.tensor_parallel.rules import LinearRule, ParallelStyle, linear_style
from opgraph.transforms.tensor_parallel.tensors import TensorParallelError, dim_of_size, op_name

WALK_KINDS = frozenset({OpKind.ROPE, OpKind.NORM, OpKind.MEMORY, OpKind.VIEW, OpKind.ELEMENTWISE, OpKind.ACTIVATION})


@dataclass
class Context:
    """Facts about the unsharded graph gathered before the rewrite."""

    heads_by_layer: dict[int | None, set[int]] = field(default_factory=dict)
    kv_factor: dict[int, int] = field(default_factory=dict)
    """GEMM op id -> split factor for K/V projections whose heads are fewer than ``tp``."""
    weight_gathers: dict[int, int] = field(default_factory=dict)
    """Memory op id -> the dimension of its output to split: the gathers of stacked expert weights by
    the routed ids that feed a sharded expert GEMM (transformers' ``batched_mm`` experts,
    ``gate_up_proj[expert_ids]``). Each rank gathers its own slice of the experts' weights, split as
    the GEMM splits its weight operand."""
    expert_gathers: dict[int, int] = field(default_factory=dict)
    """Memory op id -> the token-expert pairs of its call: the gathers of stacked expert parameters by
    the routed expert ids of ``batched_mm`` experts (the weight copies their GEMMs read, and per-pair
    biases gathered by the same ids), each an ``index`` of a parameter whose leading dimension is the
    experts into a tensor whose leading dimension is the pairs. Under expert parallelism a rank holds
    its experts' parameters and gathers for its own pairs only."""


def analyse(graph: OpGraph, tp: int, rules: Sequence[LinearRule]) -> Context:
    """Heads per layer and the split factor of K/V projections, checking that ``tp`` divides the heads;
    the expert weight gathers that feed sharded expert GEMMs."""
    ctx = Context()
    ops = graph.ops
    writers: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        for t in op.outputs:
            if t.id is not None:
                writers.setdefault(t.id, []).append(i)

    def writer_before(tensor: int | None, at: int) -> OpBase | None:
        idx = writers.get(tensor) if tensor is not None else None
        if not idx:
            return None
        k = bisect.bisect_left(idx, at)
        return ops[idx[k - 1]] if k else None

    index = {o.id: i for i, o in enumerate(ops)}

    def walk(i: int, specs: Iterable[TensorSpec], depth: int = 8) -> set[int]:
        """GEMMs that feed ``specs`` (read by op ``i``) through pointwise ops."""
        found: set[int] = set()
        frontier = [(i, s) for s in specs]
        while frontier and depth > 0:
            depth -= 1
            nxt: list[tuple[int, TensorSpec]] = []
            for at, spec in frontier:
                src = writer_before(spec.id, at)
                if src is None:
                    continue
                if src.kind is OpKind.GEMM:
                    rule = linear_style(src, rules)
                    if rule is not None and rule.style is ParallelStyle.COLUMN:
                        found.add(src.id)
                elif src.kind in WALK_KINDS:
                    nxt.extend((index[src.id], s) for s in src.inputs)
            frontier = nxt
        return found

    routed_ids: dict[tuple[int, int | None], tuple[int, int]] = {}
    for i, op in enumerate(ops):
        if isinstance(op, Gemm):
            ctx.weight_gathers.update(_weight_gathers(op, i, rules, writer_before))
            routed_ids.update(_routed_ids(op, i, rules, writer_before))
        if not isinstance(op, Attention):
            continue
        ctx.heads_by_layer.setdefault(op.layer, set()).update({op.heads, op.kv_heads})
        if op.heads % tp:
            raise TensorParallelError(
                f"{op_name(op)}: attention heads={op.heads} is not divisible by tp={tp}",
                where=f"op {op.id}",
                hint=f"choose a tp that divides {op.heads}",
            )
        if op.kv_heads % tp and tp % op.kv_heads:
            raise TensorParallelError(
                f"{op_name(op)}: kv_heads={op.kv_heads} and tp={tp} do not divide one another",
                where=f"op {op.id}",
                hint="KV heads are split when tp divides them and replicated when they divide tp",
            )
        q_gemms = walk(i, op.inputs[:1])
        kv_all = walk(i, op.inputs[1:])
        kv_gemms, fused = kv_all - q_gemms, kv_all & q_gemms
        if op.kv_heads < tp and fused:
            raise TensorParallelError(
                f"{op_name(op)}: a fused QKV projection with kv_heads={op.kv_heads} < tp={tp} "
                "(KV heads replicated inside one GEMM) is not supported",
                where=f"op {op.id}",
                hint=f"use tp <= {op.kv_heads}",
            )
        if op.kv_heads < tp:
            for g in kv_gemms:
                ctx.kv_factor[g] = op.kv_heads
    for i, op in enumerate(ops):
        pairs = _expert_gather_pairs(op, i, routed_ids, writer_before)
        if pairs is not None:
            ctx.expert_gathers[op.id] = pairs
    return ctx


WriterBefore = Callable[[int | None, int], OpBase | None]
"""``writer_before(tensor id, op index)``: the last op before that index that wrote the tensor."""


def _param_gather(op: OpBase, at: int, writer_before: WriterBefore) -> Memory | None:
    """``op`` when it is an ``index`` of a tensor no op writes before it (a parameter) by an index tensor."""
    if not isinstance(op, Memory) or op.fn != "index" or len(op.inputs) < 2 or not op.inputs[0].shape:
        return None
    return op if writer_before(op.inputs[0].id, at) is None else None


def _routed_ids(
    op: Gemm, at: int, rules: Sequence[LinearRule], writer_before: WriterBefore
) -> dict[tuple[int, int | None], tuple[int, int]]:
    """The routed expert ids by which the weight copies a ``batched_mm`` expert GEMM reads were gathered
    (one copy per token-expert pair: the GEMM's ``batch``), keyed by (tensor id, id of the op that wrote
    it), with (pairs, experts)."""
    rule = linear_style(op, rules)
    expert = op.expert
    if rule is None or not rule.moe_experts or expert is None or expert.impl is not ExpertsImpl.BATCHED_MM:
        return {}
    found: dict[tuple[int, int | None], tuple[int, int]] = {}
    for spec in op.inputs:
        src = writer_before(spec.id, at)
        gather = _param_gather(src, at, writer_before) if src is not None else None
        if gather is None or op.groups != 1:
            continue
        stacked, ids = gather.inputs[0], gather.inputs[1]
        out = gather.outputs[0] if gather.outputs else None
        if ids.id is None or out is None or not out.shape or out.shape[0] != op.batch:
            continue
        if len(stacked.shape) == 3 and stacked.shape[0] == expert.experts:
            writer = writer_before(ids.id, at)
            found[(ids.id, writer.id if writer is not None else None)] = (op.batch, expert.experts)
    return found


def _expert_gather_pairs(
    op: OpBase, at: int, routed_ids: dict[tuple[int, int | None], tuple[int, int]], writer_before: WriterBefore
) -> int | None:
    """The pairs of the ``batched_mm`` call by whose routed ids ``op`` gathers a stacked expert
    parameter (:attr:`Context.expert_gathers`), or ``None``."""
    gather = _param_gather(op, at, writer_before) if routed_ids else None
    if gather is None or gather.inputs[1].id is None:
        return None
    ids = gather.inputs[1]
    writer = writer_before(ids.id, at)
    hit = routed_ids.get((ids.id, writer.id if writer is not None else None)) if ids.id is not None else None
    if hit is None:
        return None
    pairs, experts = hit
    out = gather.outputs[0] if gather.outputs else None
    if gather.inputs[0].shape[0] != experts or out is None or not out.shape or out.shape[0] != pairs:
        return None
    return pairs


def _weight_gathers(
    op: Gemm, at: int, rules: Sequence[LinearRule], writer_before: Callable[[int | None, int], OpBase | None]
) -> dict[int, int]:
    """The gathers of stacked expert weights (an ``index`` of a rank-3 tensor no op writes: a
    parameter) that feed the expert GEMM ``op`` at position ``at``, each with the dimension of its
    output that the GEMM's rule splits: ``n`` for a column-parallel one, ``k`` for a row-parallel one,
    found as :func:`~opgraph.transforms.tensor_parallel.linear.shard_gemm` finds it in a weight."""
    rule = linear_style(op, rules)
    if rule is None or not rule.moe_experts or rule.style not in (ParallelStyle.COLUMN, ParallelStyle.ROW):
        return {}
    found: dict[int, int] = {}
    for spec in op.inputs:
        src = writer_before(spec.id, at)
        if not isinstance(src, Memory) or src.fn != "index" or not src.inputs or len(spec.shape) != 3:
            continue
        stacked = src.inputs[0]
        if len(stacked.shape) != 3 or writer_before(stacked.id, at) is not None:
            continue
        if rule.style is ParallelStyle.COLUMN:
            d = dim_of_size(spec.shape, op.n, prefer_last=True)
        else:
            d = dim_of_size(spec.shape, op.k, prefer_last=False)
        if d is not None and d > 0 and stacked.shape[1:] == spec.shape[1:]:
            found[src.id] = d
    return found
