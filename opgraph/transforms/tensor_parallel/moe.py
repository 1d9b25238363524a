"""Mixture of experts: stacked expert GEMMs split by expert (expert parallelism), the gathers of
expert weights that ``batched_mm`` experts run (split as their GEMMs split the weights), and the
combine of partial expert outputs, reduced once after it.

Expert parallelism over transformers' ``batched_mm`` experts (one ``bmm`` over the token-expert pairs,
each pair against its own gathered weight copy) splits the pairs instead: each rank holds
``ceil(experts / tp)`` experts and, with balanced routing, multiplies the pairs routed to them,
:func:`~.tensors.local_pairs` (``pairs / tp``, the busiest rank's ``ceil`` when ``tp`` does not divide
them). Every tensor sized by the pairs (the gathered weight copies and per-pair biases, the pairs'
tokens, the GEMMs' outputs and the per-pair ops between them) is a :class:`~.tensors.PairSplit`; the
dispatch stays replicated (each rank reads its own pairs of it) and the combine sums the rank's pairs
into a partial sum, all-reduced once after it, as for grouped experts."""

from __future__ import annotations

import math
from typing import Any

from opgraph.ir import (
    Activation,
    Elementwise,
    Gemm,
    Memory,
    MoeRouting,
    Norm,
    OpBase,
    Reduction,
    Softmax,
    TensorSpec,
    View,
)
from opgraph.ir.experts import ExpertsImpl
from opgraph.transforms.tensor_parallel.rules import LinearRule, ParallelStyle
from opgraph.transforms.tensor_parallel.sharder import Sharder, register_handler
from opgraph.transforms.tensor_parallel.tensors import (
    PairSplit,
    Partial,
    Split,
    State,
    local_pairs,
    reshard,
    scale_by_pairs,
)

PAIRS_NOTE = (
    "tensor parallel: expert parallelism over batched_mm experts: each rank gathers and multiplies the "
    "token-expert pairs routed to its ceil(experts / tp) experts, pairs / tp with balanced routing (every "
    "rank modelled as the busiest, ceil(pairs / tp), when tp does not divide them); routing and dispatch "
    "replicated, the combine of the rank's pairs a partial sum all-reduced after it"
)


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


def is_batched_experts(op: Gemm) -> bool:
    """Whether ``op`` is a ``batched_mm`` expert GEMM: one product per token-expert pair (``batch``)."""
    return op.expert is not None and op.expert.impl is ExpertsImpl.BATCHED_MM and op.groups == 1


def pairs_local(sh: Sharder, spec: TensorSpec) -> TensorSpec:
    """The rank's pairs of ``spec``, whose leading dimension is the token-expert pairs."""
    return reshard(spec, 0, sh.tp, ceil=True)


def shard_expert_pairs(sh: Sharder, op: Gemm, rule: LinearRule, inputs: list[TensorSpec]) -> OpBase | None:
    """A ``batched_mm`` expert GEMM split by expert: the rank's :func:`~.tensors.local_pairs` products,
    each against the rank's copy of its expert's whole weights (``n`` and ``k`` whole). ``None`` when
    an output is not sized by the pairs (the GEMM is then split inside the experts)."""
    pairs = op.batch
    if any(not t.shape or t.shape[0] != pairs for t in op.outputs):
        return None
    new_in: list[TensorSpec] = []
    for s in inputs:
        st = sh.state_of(s)
        if st is not None and not (isinstance(st, PairSplit) and st.pairs == pairs and s.shape[:1] == (pairs,)):
            s = sh.whole(op, s)  # a partial or feature-split operand: whole, then the rank's pairs of it
        new_in.append(pairs_local(sh, s) if s.shape and s.shape[0] == pairs else s)
    outs = [pairs_local(sh, t) for t in op.outputs]
    sh.set_outputs(op.outputs, [PairSplit(pairs, sh.tp, t, o) for t, o in zip(op.outputs, outs, strict=True)])
    sh.counts["column" if rule.style is not ParallelStyle.ROW else "row"] += 1
    sh.notes.append(PAIRS_NOTE)
    return sh.rebuild(op, new_in, outs, batch=local_pairs(pairs, sh.tp))


def shard_expert_gather(sh: Sharder, op: Memory, inputs: list[TensorSpec], pairs: int) -> OpBase:
    """A gather of a stacked expert parameter by the routed ids of ``batched_mm`` experts under expert
    parallelism (:attr:`~opgraph.transforms.tensor_parallel.analysis.Context.expert_gathers`): the rank
    holds ``ceil(experts / tp)`` experts' parameters and gathers copies for its own pairs only."""
    new_in = sh.all_whole(op, inputs)
    new_in = [
        reshard(s, 0, sh.tp, ceil=True) if j == 0 or (s.shape and s.shape[0] == pairs) else s
        for j, s in enumerate(new_in)
    ]
    outs = [pairs_local(sh, t) if t.shape and t.shape[0] == pairs else t for t in op.outputs]
    sh.set_outputs(
        op.outputs, [PairSplit(pairs, sh.tp, t, o) if o != t else None for t, o in zip(op.outputs, outs, strict=True)]
    )
    return sh.rebuild(op, new_in, outs, numel=scale_by_pairs(op.numel, pairs, local_pairs(pairs, sh.tp)))


def pair_fields(op: OpBase, pairs: int, local: int) -> dict[str, Any] | None:
    """The size fields of a per-pair op on ``local`` of its ``pairs`` rows; ``None`` for a kind whose
    sizes do not count rows (it runs whole)."""

    def scaled(*names: str) -> dict[str, Any]:
        return {name: scale_by_pairs(getattr(op, name), pairs, local) for name in names}

    if isinstance(op, (Elementwise, Activation)):
        return {**scaled("numel"), **({"hidden": local} if op.hidden == pairs else {})}
    if isinstance(op, Memory):
        return scaled("numel")
    if isinstance(op, Reduction):
        return scaled("numel_in", "numel_out")
    if isinstance(op, (Norm, Softmax)):
        return scaled("rows")
    if isinstance(op, View):
        return {}
    return None


def shard_pair_op(sh: Sharder, op: OpBase, inputs: list[TensorSpec]) -> OpBase:
    """A pointwise op on token-expert pairs split by expert (:class:`~.tensors.PairSplit`) runs on the
    rank's pairs: its per-pair inputs and outputs (leading dimension the pairs) are the rank's, a whole
    per-pair input (a bias gathered in the dispatch) is read as the rank's slice, locally. An op whose
    tensors do not keep the pairs leading runs whole (an all-gather of the pairs before it)."""
    states = [sh.state_of(s) for s in inputs]
    primary = next(j for j, st in enumerate(states) if isinstance(st, PairSplit))
    lead = states[primary]
    assert isinstance(lead, PairSplit)
    pairs, local = lead.pairs, local_pairs(lead.pairs, sh.tp)
    rank = len(inputs[primary].shape)
    fields = pair_fields(op, pairs, local)
    if (
        fields is None
        or any(
            isinstance(st, PairSplit) and (st.pairs != pairs or s.shape[:1] != (pairs,))
            for s, st in zip(inputs, states, strict=True)
        )
        or any(not t.shape or t.shape[0] != pairs for t in op.outputs)
    ):
        return sh.replicated(op, inputs)
    new_in: list[TensorSpec] = []
    for s, st in zip(inputs, states, strict=True):
        if isinstance(st, (Partial, Split)):
            s = sh.whole(op, s)
        if isinstance(st, PairSplit) or (len(s.shape) == rank and s.shape[0] == pairs):
            s = pairs_local(sh, s)
        new_in.append(s)
    outs = [pairs_local(sh, t) for t in op.outputs]
    sh.set_outputs(op.outputs, [PairSplit(pairs, sh.tp, t, o) for t, o in zip(op.outputs, outs, strict=True)])
    return sh.rebuild(op, new_in, outs, **fields)


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
    """Routing and dispatch replicated; the combine of partial expert outputs stays partial, and so does
    the combine of a rank's token-expert pairs (expert parallelism over ``batched_mm`` experts): each
    rank sums its own pairs, reading its slice of the per-pair routing weights."""
    pair_states = [st for st in (sh.state_of(s) for s in inputs) if isinstance(st, PairSplit)]
    if op.fn == "combine" and pair_states:
        pairs = pair_states[0].pairs
        new_in: list[TensorSpec] = []
        for s in inputs:
            st = sh.state_of(s)
            if st is not None and not (isinstance(st, PairSplit) and st.pairs == pairs and s.shape[:1] == (pairs,)):
                s = sh.whole(op, s)
            new_in.append(pairs_local(sh, s) if s.shape and s.shape[0] == pairs else s)
        sh.set_outputs(op.outputs, [Partial(t) for t in op.outputs])
        return sh.rebuild(op, new_in, op.outputs)
    if op.fn != "combine" or not any(isinstance(sh.state_of(s), Partial) for s in inputs):
        return sh.replicated(op, inputs)
    # The weighted sum of partial expert outputs is itself partial: reduce once, after it.
    whole = [sh.whole(op, s) if isinstance(sh.state_of(s), Split) else s for s in inputs]
    sh.set_outputs(op.outputs, [Partial(t) for t in op.outputs])
    return sh.rebuild(op, whole, op.outputs)
