"""Facts about the unsharded graph gathered before the rewrite: head counts and K/V split factors."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from opgraph.ir import Attention, OpBase, OpGraph, OpKind, TensorSpec
from opgraph.transforms.tensor_parallel.rules import LinearRule, ParallelStyle, linear_style
from opgraph.transforms.tensor_parallel.tensors import TensorParallelError, op_name

WALK_KINDS = frozenset({OpKind.ROPE, OpKind.NORM, OpKind.MEMORY, OpKind.VIEW, OpKind.ELEMENTWISE, OpKind.ACTIVATION})


@dataclass
class Context:
    """Facts about the unsharded graph gathered before the rewrite."""

    heads_by_layer: dict[int | None, set[int]] = field(default_factory=dict)
    kv_factor: dict[int, int] = field(default_factory=dict)
    """GEMM op id -> split factor for K/V projections whose heads are fewer than ``tp``."""


def analyse(graph: OpGraph, tp: int, rules: Sequence[LinearRule]) -> Context:
    """Heads per layer and the split factor of K/V projections, checking that ``tp`` divides the heads."""
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

    for i, op in enumerate(ops):
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
    return ctx
