"""Pointwise ops (RoPE, norms, activations, elementwise, memory, views, softmax, reductions): they
shrink with a split input, stay partial when linear in a partial sum, and are replicated otherwise."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from opgraph.ir import (
    Activation,
    Elementwise,
    Memory,
    Norm,
    OpBase,
    Reduction,
    Rope,
    Softmax,
    TensorSpec,
    View,
)
from opgraph.transforms.tensor_parallel.moe import shard_expert_gather, shard_pair_op, shard_weight_gather
from opgraph.transforms.tensor_parallel.sharder import Sharder, register_handler
from opgraph.transforms.tensor_parallel.tensors import PairSplit, Partial, Split, State, pick_dim, reshard

LINEAR_PROPAGATING = frozenset({"copy", "cast", "clone", "contiguous", "view", "reshape", "_to_copy"})


def keeps_partial(sh: Sharder, op: OpBase, inputs: Sequence[TensorSpec]) -> bool:
    """Whether ``op`` is linear in its partial inputs, so its output is partial too."""
    parts = [isinstance(sh.state_of(s), Partial) for s in inputs]
    if not any(parts) or any(isinstance(sh.state_of(s), Split) for s in inputs):
        return False
    if isinstance(op, View):
        return True
    if isinstance(op, Memory):
        return op.fn in LINEAR_PROPAGATING and sum(parts) == 1
    if isinstance(op, Elementwise):
        tensors = [p for p, s in zip(parts, inputs, strict=True) if s.numel > 1]
        if op.fn in ("add", "sub"):
            return bool(tensors) and all(tensors)
        if op.fn in ("mul", "neg") or (op.fn == "div" and parts[0]):
            return sum(parts) == 1
    return False


@register_handler(Rope, Norm, Activation, Elementwise, Memory, View, Softmax, Reduction)
def shard_pointwise(sh: Sharder, op: OpBase, inputs: list[TensorSpec]) -> OpBase:
    """A pointwise op on the local slice of its split input, partial when linear in a partial sum
    (a gather of expert weights for a sharded expert GEMM: :func:`.moe.shard_weight_gather`; under expert
    parallelism, a gather by the routed ids of ``batched_mm`` experts and the ops on the rank's
    token-expert pairs: :func:`.moe.shard_expert_gather`, :func:`.moe.shard_pair_op`)."""
    if sh.expert_parallel and isinstance(op, Memory) and op.id in sh.ctx.expert_gathers:
        return shard_expert_gather(sh, op, inputs, sh.ctx.expert_gathers[op.id])
    if any(isinstance(sh.state_of(s), PairSplit) for s in inputs):
        return shard_pair_op(sh, op, inputs)
    if isinstance(op, Memory) and op.id in sh.ctx.weight_gathers:
        return shard_weight_gather(sh, op, inputs, sh.ctx.weight_gathers[op.id])
    if keeps_partial(sh, op, inputs):
        sh.set_outputs(op.outputs, [Partial(t) for t in op.outputs])
        return sh.rebuild(op, inputs, op.outputs)
    inputs = [sh.whole(op, s) if isinstance(sh.state_of(s), Partial) else s for s in inputs]
    primary = next((j for j, s in enumerate(inputs) if isinstance(sh.state_of(s), Split)), None)
    if primary is None:
        sh.set_outputs(op.outputs, None)
        return sh.rebuild(op, inputs, op.outputs)
    st = sh.state_of(inputs[primary])
    assert isinstance(st, Split)
    f = st.factor
    hints = sh.hints(op) | ({op.heads} if isinstance(op, Rope) else set())
    shape = inputs[primary].shape
    d = pick_dim(shape, f, st.block, hints, inputs[primary].strides)
    if d is None:
        return sh.replicated(op, inputs)
    new_in: list[TensorSpec] = []
    for j, s in enumerate(inputs):
        sj = sh.state_of(s)
        if j == primary:
            new_in.append(reshard(s, d, f))
        elif isinstance(sj, Split):
            dj = pick_dim(s.shape, sj.factor, sj.block, hints, s.strides)
            new_in.append(reshard(s, dj, sj.factor) if dj is not None else sh.whole(op, s))
        elif len(s.shape) == len(shape) and s.shape[d] == shape[d] and s.shape[d] > 1:
            new_in.append(reshard(s, d, f))  # a local slice of a whole tensor, no communication
        else:
            new_in.append(s)
    outs: list[TensorSpec] = []
    states: list[State] = []
    for t in op.outputs:
        if len(t.shape) == len(shape) and t.shape[d] == shape[d]:
            dt: int | None = d
        elif isinstance(op, Reduction):
            dt = None  # it may reduce over the split dimension: read it whole
        else:
            dt = pick_dim(t.shape, f, None, hints)
        if dt is None:
            return sh.replicated(op, inputs)
        local = reshard(t, dt, f)
        outs.append(local)
        states.append(Split(f, math.prod(t.shape[dt:]), t, local))
    fields = pointwise_fields(sh, op, f, d, shape, outs)
    if fields is None:
        return sh.replicated(op, inputs)
    sh.set_outputs(op.outputs, states)
    return sh.rebuild(op, new_in, outs, **fields)


def pointwise_fields(
    sh: Sharder, op: OpBase, f: int, d: int, shape: Sequence[int], outs: Sequence[TensorSpec]
) -> dict[str, Any] | None:
    """The kind fields of a pointwise op whose tensors shrank by ``f``; None if it cannot split."""
    last = d == len(shape) - 1

    def div(v: int) -> int:
        return v // f if v % f == 0 else max(1, round(v / f))

    def hidden_of(h: int) -> int:
        if outs and outs[0].shape and last and h > 1:
            return outs[0].shape[-1]
        return h

    if isinstance(op, (Elementwise, Activation)):
        return {"numel": div(op.numel), "hidden": hidden_of(op.hidden)}
    if isinstance(op, Memory):
        return {"numel": div(op.numel)}
    if isinstance(op, View):
        return {}
    if isinstance(op, Rope):
        if op.heads % f:
            return None
        return {"heads": op.heads // f}
    if isinstance(op, Norm):
        if last and shape[d] == op.hidden:
            sh.notes.append(
                "tensor parallel: a norm over split features is computed per rank; the all-reduce of its "
                "statistics (a few bytes per row) is not modelled"
            )
            return {"hidden": op.hidden // f}
        return {"rows": div(op.rows)}
    if isinstance(op, Softmax):
        if last:
            return None
        return {"rows": div(op.rows)}
    if isinstance(op, Reduction):
        return {"numel_in": div(op.numel_in), "numel_out": div(op.numel_out)}
    return None
