"""Mixture of experts: stacked expert GEMMs split by expert (expert parallelism), the gathers of
expert weights that ``batched_mm`` experts run (split as their GEMMs split the weights), and the
combine of partial expert outputs, reduced once after it."""

from __future__ import annotations

import math

from opgraph.ir import Gemm, Memory, MoeRouting, OpBase, TensorSpec
from opgraph.transforms.tensor_parallel.rules import LinearRule, ParallelStyle
from opgraph.transforms.tensor_parallel.sharder import Sharder, register_handler
from opgraph.transforms.tensor_parallel.tensors import Partial, Split, State, reshard


def shard_experts(sh: Sharder, op: Gemm, rule: LinearRule, inputs: list[TensorSpec]) -> OpBase:
    """Stacked experts split by expert: each rank runs ``groups / tp`` of them; when tp does not divide
    the active experts, every rank is modelled as the busiest one, ``ceil(groups / tp)``."""
    tp = sh.tp
    uneven = op.groups % tp != 0
    new_in: list[TensorSpec] = []
    for s in inputs:
        if isinstance(sh.state_of(s), Partial):
            s = sh.whole(op, s)
        new_in.append(reshard(s, 0, tp, ceil=uneven) if len(s.shape) >= 2 and s.shape[0] == op.groups else s)
    outs = [reshard(t, 0, tp, ceil=uneven) if t.shape and t.shape[0] == op.groups else t for t in op.outputs]
    if rule.style is ParallelStyle.ROW:
        states: list[State] = [Partial(o) for o in outs]
    else:
        states = [
            Split(tp, math.prod(t.shape), t, o) if t != o else None for t, o in zip(op.outputs, outs, strict=True)
        ]
    sh.set_outputs(op.outputs, states)
    sh.counts["column" if rule.style is not ParallelStyle.ROW else "row"] += 1
    return sh.rebuild(op, new_in, outs, groups=-(-op.groups // tp))


def shard_weight_gather(sh: Sharder, op: Memory, inputs: list[TensorSpec], dim: int) -> OpBase:
    """A gather of stacked expert weights by the routed ids (transformers' ``batched_mm`` experts:
    ``gate_up_proj[expert_ids]``, one weight copy per token-expert pair) that feeds a sharded expert
    GEMM (:attr:`~opgraph.transforms.tensor_parallel.analysis.Context.weight_gathers`). Each rank holds
    its slice of every expert's weights (``n / tp`` of gate_up, ``k / tp`` of down, as Megatron shards
    experts), so it gathers copies of that slice only: the stacked weights and the copies split along
    ``dim``, the copies a split tensor the GEMM reads as it is."""
    tp = sh.tp
    out = op.outputs[0] if op.outputs else None
    if out is None or len(out.shape) <= dim or out.shape[dim] % tp or op.numel % tp:
        return sh.replicated(op, inputs)  # the GEMM reports the dimension tp does not divide
    new_in = [
        reshard(s, dim, tp) if len(s.shape) == len(out.shape) and s.shape[1:] == out.shape[1:] else s
        for s in sh.all_whole(op, inputs)
    ]
    outs = [reshard(t, dim, tp) for t in op.outputs]
    sh.set_outputs(
        op.outputs, [Split(tp, math.prod(t.shape[dim:]), t, o) for t, o in zip(op.outputs, outs, strict=True)]
    )
    return sh.rebuild(op, new_in, outs, numel=op.numel // tp)


@register_handler(MoeRouting)
def shard_moe_routing(sh: Sharder, op: MoeRouting, inputs: list[TensorSpec]) -> OpBase:
    """Routing and dispatch replicated; the combine of partial expert outputs stays partial."""
    if op.fn != "combine" or not any(isinstance(sh.state_of(s), Partial) for s in inputs):
        return sh.replicated(op, inputs)
    # The weighted sum of partial expert outputs is itself partial: reduce once, after it.
    new_in = [sh.whole(op, s) if isinstance(sh.state_of(s), Split) else s for s in inputs]
    sh.set_outputs(op.outputs, [Partial(t) for t in op.outputs])
    return sh.rebuild(op, new_in, op.outputs)
