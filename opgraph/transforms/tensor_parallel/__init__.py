"""Megatron-style tensor-parallel sharding: the graph that ONE rank of a ``tp``-way run executes.

All ranks run the same sharded graph (SPMD), so one rank's graph plus ``--tp N`` in the simulator
is the whole run. The pass follows Megatron-LM and vLLM:

- Linear layers are found by their module ``scope`` through a small table of rules
  (:data:`DEFAULT_LINEAR_RULES`): column-parallel layers (q/k/v/qkv, gate/up/gate_up, MoE expert
  gate_up, MLA ``q_b_proj``/``kv_b_proj``) keep ``n / tp`` output features; row-parallel layers
  (o_proj, down_proj, expert down) keep ``k / tp`` input features and produce partial sums that an
  ``all_reduce`` completes; router GEMMs and MLA down-projections stay replicated; GEMMs no rule
  knows stay replicated and are listed in the graph's assumptions.
- Sharding is propagated through the data flow: every tensor is replicated, split (a feature or
  head dimension divided by a factor) or partial (a sum still to be reduced). Pointwise ops on split
  tensors (RoPE, norms over heads, activations, KV-cache writes) shrink with them; attention keeps
  ``heads / tp`` query heads and ``kv_heads / tp`` key/value heads, or one replicated KV head
  per rank when ``kv_heads < tp`` (as vLLM does). Where an op needs a whole tensor, a collective is
  inserted right after the tensor's producer: ``all_reduce`` for partial sums (so the all-reduce
  of an MoE layer comes after the combine, as in vLLM's fused MoE), ``all_gather`` for splits.
- Embedding: vocab-parallel (each rank holds ``vocab / tp`` rows, masked lookup, then an
  all-reduce) by default, or replicated. ``lm_head``: column-parallel over the (padded) vocabulary
  followed by an all-gather of the logits by default, or replicated.

Op ids are kept (a sharded op has the id it had before, so timelines of TP=1 and TP=N runs can be
compared op by op); inserted collectives get new ids above the largest. Each changed op is built
anew from its changed fields so the IR derives FLOPs, bytes and the definition; values a capture
pass had set differently from the derived ones are scaled by the same ratio instead.

Layout: :mod:`.rules` (which GEMMs are column/row/vocab-parallel), :mod:`.tensors` (sharding states
and split geometry), :mod:`.analysis` (heads and K/V factors), :mod:`.sharder` (the walk, collectives
and the handler registry), and one module per kind of op: :mod:`.linear`, :mod:`.attention`,
:mod:`.embedding`, :mod:`.moe`, :mod:`.pointwise`. Ops of other kinds (top-k, ``other``) are replicated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from opgraph.ir import OpGraph, OpKind

# The handler modules register themselves with the sharder on import.
from opgraph.transforms.tensor_parallel import attention as _attention  # noqa: F401
from opgraph.transforms.tensor_parallel import embedding as _embedding  # noqa: F401
from opgraph.transforms.tensor_parallel import linear as _linear  # noqa: F401
from opgraph.transforms.tensor_parallel import moe as _moe  # noqa: F401
from opgraph.transforms.tensor_parallel import pointwise as _pointwise  # noqa: F401
from opgraph.transforms.tensor_parallel.rules import DEFAULT_LINEAR_RULES, LinearRule, ParallelStyle, linear_style
from opgraph.transforms.tensor_parallel.sharder import Sharder, register_handler
from opgraph.transforms.tensor_parallel.tensors import TensorParallelError

__all__ = [
    "DEFAULT_LINEAR_RULES",
    "LinearRule",
    "ParallelStyle",
    "TensorParallelError",
    "linear_style",
    "register_handler",
    "shard_tensor_parallel",
]


def shard_tensor_parallel(
    graph: OpGraph,
    tp: int,
    *,
    rules: Sequence[LinearRule] = DEFAULT_LINEAR_RULES,
    embedding: Literal["vocab_parallel", "replicated"] = "vocab_parallel",
    lm_head: Literal["vocab_parallel", "replicated"] = "vocab_parallel",
    expert_parallel: bool = False,
) -> OpGraph:
    """The graph one rank of a ``tp``-way Megatron-style tensor-parallel run executes.

    Parameters
    ----------
    graph:
        A captured (unsharded) graph; it must contain no collectives yet.
    tp:
        Tensor-parallel degree (1 returns the graph with ``capture["tp"] = 1``).
    rules:
        Scope rules that say which GEMMs are column- or row-parallel (:data:`DEFAULT_LINEAR_RULES`).
    embedding, lm_head:
        ``vocab_parallel`` (split over the vocabulary, with an all-reduce / all-gather) or
        ``replicated``.
    expert_parallel:
        Split stacked MoE experts by expert (``groups / tp``) instead of inside each expert.

    Raises
    ------
    TensorParallelError
        ``tp < 1``, a graph that already has collectives, or a dimension that ``tp`` does not
        divide (the message names the op and the dimension).

    Examples
    --------
    >>> from opgraph.ir import Gemm, OpGraph, TensorSpec, DType
    >>> x = TensorSpec(shape=(8, 4096), dtype=DType.bf16, id=0)
    >>> w = TensorSpec(shape=(4096, 4096), dtype=DType.bf16, id=1)
    >>> y = TensorSpec(shape=(8, 4096), dtype=DType.bf16, id=2)
    >>> g = OpGraph(ops=(Gemm(id=0, m=8, n=4096, k=4096, inputs=(x, w), outputs=(y,), scope="mlp.down_proj"),))
    >>> s = shard_tensor_parallel(g, 2)
    >>> [(o.kind.value, getattr(o, "k", None)) for o in s.ops]
    [('gemm', 2048), ('collective', None)]
    """
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise TensorParallelError(f"tp must be 1 or more, got {tp!r}", where="tp", hint="give the number of ranks")
    if embedding not in ("vocab_parallel", "replicated"):
        raise TensorParallelError(
            f"unknown embedding mode {embedding!r}", where="embedding", hint="vocab_parallel or replicated"
        )
    if lm_head not in ("vocab_parallel", "replicated"):
        raise TensorParallelError(
            f"unknown lm_head mode {lm_head!r}", where="lm_head", hint="vocab_parallel or replicated"
        )
    sharded = graph.metadata.capture.get("tp")
    if isinstance(sharded, int) and sharded > 1:
        raise TensorParallelError(
            f"the graph is already sharded for tp={sharded}", where="graph", hint="shard the unsharded capture"
        )
    colls = graph.ops_of(OpKind.COLLECTIVE)
    if colls and tp > 1:
        raise TensorParallelError(
            f"the graph already has {len(colls)} collective op(s) (op {colls[0].id}): it is a per-rank graph",
            where="graph",
            hint="simulate it with --tp as it is (opgraph simulate --no-shard)",
        )
    if tp == 1:
        md = graph.metadata
        return graph.model_copy(update={"metadata": md.model_copy(update={"capture": {**md.capture, "tp": 1}})})
    graph.lint()
    return Sharder(graph, tp, rules, embedding, lm_head, expert_parallel).run()
