"""Attention: ``heads / tp`` query heads and ``kv_heads / tp`` KV heads (one replicated KV head per
rank when ``kv_heads < tp``), with the per-head inputs sliced to match."""

from __future__ import annotations

import math

from opgraph.ir import Attention, OpBase, TensorSpec
from opgraph.transforms.tensor_parallel.sharder import Sharder, register_handler
from opgraph.transforms.tensor_parallel.tensors import (
    Partial,
    Split,
    State,
    TensorParallelError,
    head_dim,
    op_name,
    pick_dim,
    reshard,
)


@register_handler(Attention)
def shard_attention(sh: Sharder, op: Attention, inputs: list[TensorSpec]) -> OpBase:
    """Attention over the rank's heads, split as its query (and K/V) inputs arrive split."""
    # The query is the split input of the query's size (eager attention passes ALiBi or a
    # mask first); without a split query the attention stays whole.
    splits = [j for j, t in enumerate(inputs) if isinstance(sh.state_of(t), Split)]
    q_numel = op.batch * op.q_len * op.heads * op.head_dim
    qi = next((j for j in splits if inputs[j].numel == q_numel), splits[0] if splits else None)
    if qi is None:
        return sh.replicated(op, inputs)
    q_state = sh.state_of(inputs[qi])
    assert isinstance(q_state, Split)
    fq = q_state.factor
    kv_states = [s for s in (sh.state_of(inputs[j]) for j in splits if j != qi) if isinstance(s, Split)]
    fkv = kv_states[0].factor if kv_states else 1
    heads, kv_heads = op.heads // fq, max(1, op.kv_heads // fkv)
    if heads % kv_heads:
        raise TensorParallelError(
            f"{op_name(op)}: {heads} query heads per rank do not group over {kv_heads} KV heads (tp={sh.tp})",
            where=f"op {op.id}",
        )
    b = op.batch
    q_sizes = (op.heads, b * op.heads)
    kv_sizes = (op.kv_heads, b * op.kv_heads)
    new_in: list[TensorSpec] = []
    for j, s in enumerate(inputs):
        st = sh.state_of(s)
        if isinstance(st, Partial):
            s, st = sh.whole(op, s), None
        if isinstance(st, Split):
            sizes = q_sizes if j == qi else (*kv_sizes, *q_sizes)
            d = head_dim(s.shape, sizes, st.factor)
            if d is None:
                d = pick_dim(s.shape, st.factor, st.block, {op.heads, op.kv_heads})
            if d is None:
                new_in.append(sh.whole(op, s))
                continue
            new_in.append(reshard(s, d, st.factor))
            continue
        # Replicated per-head inputs (sinks, ALiBi slopes, a KV cache passed in): each rank its slice.
        d = head_dim(s.shape, q_sizes, fq)
        if d is not None and len(s.shape) >= 3:
            new_in.append(reshard(s, d, fq))
            continue
        d = head_dim(s.shape, kv_sizes, fkv) if fkv > 1 else None
        if d is not None and len(s.shape) >= 3 and s.id not in sh.producer:
            new_in.append(reshard(s, d, fkv))
            continue
        new_in.append(s)
    outs: list[TensorSpec] = []
    states: list[State] = []
    for t in op.outputs:
        d = head_dim(t.shape, q_sizes, fq)
        if d is None:
            d = pick_dim(t.shape, fq, None, {op.heads})
        if d is None:
            outs.append(t)
            states.append(None)
            continue
        local = reshard(t, d, fq)
        outs.append(local)
        states.append(Split(fq, math.prod(t.shape[d:]), t, local))
    sh.set_outputs(op.outputs, states)
    return sh.rebuild(op, new_in, outs, heads=heads, kv_heads=kv_heads)
