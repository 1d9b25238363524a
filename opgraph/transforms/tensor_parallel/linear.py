"""GEMMs: column-parallel (``n / tp``), row-parallel (``k / tp``, partial sums), vocab-parallel
``lm_head`` (then an all-gather of the logits), per-head batched GEMMs; expert parallelism (stacked
experts by expert, ``batched_mm`` experts by token-expert pair) in :mod:`.moe`."""

from __future__ import annotations

import math
from collections.abc import Sequence

from opgraph.ir import CollectiveKind, Gemm, OpBase, TensorSpec
from opgraph.transforms.tensor_parallel.moe import is_batched_experts, shard_expert_pairs, shard_experts
from opgraph.transforms.tensor_parallel.rules import ParallelStyle, linear_style
from opgraph.transforms.tensor_parallel.sharder import Sharder, register_handler
from opgraph.transforms.tensor_parallel.tensors import PairSplit, Partial, Split, State, dim_of_size, pick_dim, reshard


def gemm_roles(sh: Sharder, op: Gemm, inputs: Sequence[TensorSpec]) -> tuple[int | None, list[int], list[int]]:
    """(activation index, weight indices, bias indices) of a GEMM's inputs, from their shapes.

    The activation is ``rows x k``, or ``k x m`` per product when the weight comes first (transformers'
    ``batched_mm`` experts: each token-expert pair's gathered ``[n, k]`` weight @ its token as
    ``[k, 1]``); a bias is a vector of ``n``; everything else is a weight. When shapes are ambiguous,
    the input some op produced is the activation (a gathered expert weight is produced too, so the
    shapes decide first).
    """
    rows = op.m * op.batch * op.groups
    biases = [j for j, s in enumerate(inputs) if len(s.shape) == 1 and s.numel == op.n]
    rest = [j for j in range(len(inputs)) if j not in biases]

    def is_activation(s: TensorSpec) -> bool:
        if not s.shape or s.numel != rows * op.k:
            return False
        weight_first = len(s.shape) >= 3 and s.shape[-2:] == (op.k, op.m)
        return s.shape[-1] == op.k or weight_first

    fits = [j for j in rest if is_activation(inputs[j])]
    made = [j for j in rest if inputs[j].id is not None and inputs[j].id in sh.producer]
    act = next((j for j in fits if j in made), fits[0] if fits else (made[0] if made else None))
    return act, [j for j in rest if j != act], biases


@register_handler(Gemm)
def shard_gemm(sh: Sharder, op: Gemm, inputs: list[TensorSpec]) -> OpBase:
    """A GEMM by the first linear rule that matches it (unknown GEMMs replicated and listed)."""
    rule = linear_style(op, sh.rules)
    tp = sh.tp
    split_in = [s for s in inputs if isinstance(sh.state_of(s), Split)]
    if rule is None or rule.style is ParallelStyle.REPLICATED:
        if rule is None and op.batch > 1 and split_in:
            return shard_batched(sh, op, inputs)
        if rule is None:
            sh.unknown.append(op)
        return sh.replicated(op, inputs)
    if sh.expert_parallel and rule.moe_experts:
        if op.groups > 1:
            return shard_experts(sh, op, rule, list(inputs))
        if is_batched_experts(op):
            by_pairs = shard_expert_pairs(sh, op, rule, list(inputs))
            if by_pairs is not None:
                return by_pairs
    # Token-expert pairs split by expert are read whole by a GEMM split any other way.
    inputs = [sh.whole(op, s) if isinstance(sh.state_of(s), PairSplit) else s for s in inputs]
    act, weights, biases = gemm_roles(sh, op, inputs)
    new_in = list(inputs)
    if rule.style in (ParallelStyle.COLUMN, ParallelStyle.VOCAB):
        vocab = rule.style is ParallelStyle.VOCAB
        if vocab and sh.lm_head == "replicated":
            return sh.replicated(op, inputs)
        f = sh.ctx.kv_factor.get(op.id, tp)
        if op.n % f and not vocab:
            raise sh.fail(op, "n (output features)", op.n, f)
        new_n = -(-op.n // f)
        if vocab and op.n % f:
            sh.notes.append(
                f"tensor parallel: the vocabulary of op {op.id} ({op.n}) is padded to {new_n * f} for tp={f}"
            )
        if act is not None:
            new_in[act] = sh.whole(op, new_in[act])
        for j in (*weights, *biases):
            d = dim_of_size(new_in[j].shape, op.n, prefer_last=True)
            if d is not None:
                new_in[j] = reshard(new_in[j], d, f, ceil=vocab)
        outs: list[TensorSpec] = []
        states: list[State] = []
        for t in op.outputs:
            d = dim_of_size(t.shape, op.n, prefer_last=True)
            if d is None:
                outs.append(t)
                states.append(None)
                continue
            local = reshard(t, d, f, ceil=vocab)
            outs.append(local)
            states.append(Split(f, math.prod(t.shape[d:]), t, local) if f > 1 else None)
        sh.counts["column"] += 1
        new = sh.rebuild(op, new_in, outs, n=new_n)
        sh.set_outputs(op.outputs, states)
        if vocab:
            # Logits are gathered right away: sampling and every later reader need all of them.
            for t in op.outputs:
                if t.id is not None and t.id in sh.state:
                    sh.producer[t.id] = new
                    sh.emit_collective(CollectiveKind.ALL_GATHER, t.id, op)
                    sh.force.add(t.id)
        return new
    # Row-parallel: the input features are split; each rank computes a partial sum.
    if op.k % tp:
        raise sh.fail(op, "k (input features)", op.k, tp)
    if act is not None:
        st = sh.state_of(new_in[act])
        if isinstance(st, Partial) or (isinstance(st, Split) and st.factor != tp):
            new_in[act] = sh.whole(op, new_in[act])
            st = None
        shape = new_in[act].shape
        if shape and shape[-1] == op.k:
            d = len(shape) - 1
        elif len(shape) >= 3 and shape[-2:] == (op.k, op.m):
            d = len(shape) - 2  # weight first ([n, k] @ [k, m]): the token's k is second to last
        else:
            d = pick_dim(shape, tp, st.block if isinstance(st, Split) else op.k, set())
        if d is not None:
            new_in[act] = reshard(new_in[act], d, tp)
    for j in weights:
        d = dim_of_size(new_in[j].shape, op.k, prefer_last=False)
        if d is not None:
            new_in[j] = reshard(new_in[j], d, tp)
    sh.counts["row"] += 1
    new = sh.rebuild(op, new_in, op.outputs, k=op.k // tp)
    sh.set_outputs(op.outputs, [Partial(t) for t in op.outputs])
    return new


def shard_batched(sh: Sharder, op: Gemm, inputs: list[TensorSpec]) -> OpBase:
    """A per-head batched GEMM (eager attention) on split inputs: ``batch / f``."""
    st = next(s for s in (sh.state_of(t) for t in inputs) if isinstance(s, Split))
    f = st.factor
    if op.batch % f:
        return sh.replicated(op, inputs)
    new_in = [sh.whole(op, s) if isinstance(sh.state_of(s), Partial) else s for s in inputs]
    new_in = [reshard(s, 0, f) if s.shape and s.shape[0] % f == 0 else s for s in new_in]
    outs = [reshard(t, 0, f) if t.shape and t.shape[0] % f == 0 else t for t in op.outputs]
    sh.set_outputs(
        op.outputs,
        [Split(f, math.prod(t.shape), t, o) if t != o else None for t, o in zip(op.outputs, outs, strict=True)],
    )
    return sh.rebuild(op, new_in, outs, batch=op.batch // f)
