"""The attention mask of a chunk over a cached prefix, for :mod:`opgraph.transforms.rebatch`.

A prefill template runs SDPA with its causal flag and no mask: transformers (5.17 and 5.24,
``masking_utils.sdpa_mask``) skips the mask when queries and keys have one length. A chunk of ``q``
tokens over ``p`` cached ones cannot skip it: the model builds a boolean ``[1, 1, q, p + q]`` mask
once per forward, outside the layers (``arange`` of the batch, of one head, of the queries and of
the keys, each index offset by an ``add``, then ``kv_idx <= q_idx``: an ``le``), expands it to the
batch and passes it to every full-attention layer's SDPA. With a mask SDPA cannot use its GQA path
(``use_gqa_in_sdpa``), so a layer with fewer key/value heads than query heads copies its keys and
values to every query head first (``repeat_kv``: one ``clone`` each). This module adds those ops to
a rebatched graph, as a fresh capture of the chunk records them.

Sliding-window SDPA layers (their own mask, ``create_sliding_window_causal_mask``) and templates that
already pass a mask (eager attention) are left as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opgraph.ir.dtypes import DType
from opgraph.ir.graph import Edge, EdgeKind, OpGraph
from opgraph.ir.ops import OP_TYPES, AtenCall, Attention, Elementwise, Memory, OpBase
from opgraph.ir.tensor import TensorSpec
from opgraph.transforms.rebatch_moe import graph_memo

__all__ = ["MaskPlan", "MaskedChunk", "add_prefix_masks", "mask_plan"]

SDPA = "aten.scaled_dot_product_attention"
_DERIVED = ("flops", "bytes_read", "bytes_written", "definition")


@dataclass(frozen=True)
class MaskPlan:
    """Where a prefill template's chunk-over-a-prefix mask goes (template op indices)."""

    after: int
    """The mask ops follow this op (the last op of the model's own scope before the layers: its positions)."""
    attention: tuple[tuple[int, tuple[int, ...]], ...]
    """Each attention that takes the mask, with the ops that produce its keys and values when it copies
    them to every query head (GQA: ``repeat_kv``), else ``()``."""


@dataclass(frozen=True)
class MaskedChunk:
    """One chunk of a rebatched graph that takes a mask: ``batch`` sequences of ``q_len`` tokens over
    ``kv_len`` keys, its attention ops and their key/value producers by op id in that graph."""

    batch: int
    q_len: int
    kv_len: int
    after: int
    attention: tuple[tuple[int, tuple[int, ...]], ...]


_PLAN_CACHE: dict[int, tuple[OpGraph, MaskPlan | None]] = {}


def mask_plan(graph: OpGraph) -> MaskPlan | None:
    """The :class:`MaskPlan` of a prefill template, or ``None`` where it has no unmasked causal SDPA of a
    full-attention layer (memoised)."""
    return graph_memo(_PLAN_CACHE, graph, _build_plan)


def _maskless(op: OpBase) -> bool:
    return (
        isinstance(op, Attention)
        and op.target == SDPA
        and op.causal
        and op.window is None
        and op.q_len == op.kv_len
        and len(op.inputs) == 3
    )


def _build_plan(graph: OpGraph) -> MaskPlan | None:
    ops = graph.ops
    attention = [i for i, op in enumerate(ops) if _maskless(op)]
    if graph.metadata.phase != "prefill" or not attention:
        return None
    first = next(i for i, op in enumerate(ops) if op.layer is not None)
    root = ops[first].scope.split(".layers.")[0]
    after = max((i for i in range(first) if ops[i].scope == root), default=first - 1)
    index = {op.id: i for i, op in enumerate(ops)}
    made: dict[tuple[int, int | None], int] = {
        (e.dst, e.tensor): index[e.src] for e in graph.edges if e.kind is EdgeKind.DATA and e.tensor is not None
    }
    plan: list[tuple[int, tuple[int, ...]]] = []
    for i in attention:
        op = ops[i]
        assert isinstance(op, Attention)
        sources: tuple[int, ...] = ()
        if op.heads != op.kv_heads:
            found = tuple(made.get((op.id, t.id)) for t in op.inputs[1:3])
            sources = tuple(s for s in found if s is not None)
            if len(sources) != 2:
                return None  # not the layout transformers records: leave the graph unmasked
        plan.append((i, sources))
    return MaskPlan(after, tuple(plan))


def _new(kind_op: type[OpBase], **fields: Any) -> OpBase:
    return kind_op.model_validate(fields)


class _Ids:
    def __init__(self, ops: Sequence[OpBase]) -> None:
        self.next = 1 + max((t.id for op in ops for t in (*op.inputs, *op.outputs) if t.id is not None), default=-1)

    def __call__(self) -> int:
        self.next += 1
        return self.next - 1


def _mask_ops(chunk: MaskedChunk, like: OpBase, ids: _Ids) -> list[OpBase]:
    """The ops of ``sdpa_mask`` for ``chunk`` (``like`` gives their scope, stage and step); the last is the mask."""
    place = {"scope": like.scope, "stage": like.stage, "step": like.step, "dtype": DType.fp32}
    idx = DType("int64")

    def arange(n: int) -> OpBase:
        out = TensorSpec(shape=(n,), dtype=idx, id=ids())
        call = AtenCall(args=(n,), keywords={"pin_memory": False})
        return _new(Memory, id=0, target="aten.arange.default", outputs=(out,), fn="fill", numel=n, call=call, **place)

    def offset(src: OpBase, n: int, by: int) -> OpBase:
        out = TensorSpec(shape=(n,), dtype=idx, id=ids())
        call = AtenCall(args=({"tensor": 0}, by))
        return _new(
            Elementwise,
            id=0,
            target="aten.add.Tensor",
            inputs=src.outputs,
            outputs=(out,),
            fn="add",
            numel=n,
            hidden=n,
            call=call,
            **place,
        )

    q, kv = chunk.q_len, chunk.kv_len
    q_ar, kv_ar = arange(q), arange(kv)
    q_idx, kv_idx = offset(q_ar, q, kv - q), offset(kv_ar, kv, 0)
    ins = (
        kv_idx.outputs[0].model_copy(update={"shape": (1, 1, 1, kv)}),
        q_idx.outputs[0].model_copy(update={"shape": (1, 1, q, 1)}),
    )
    mask = TensorSpec(shape=(1, 1, q, kv), dtype=DType("bool"), id=ids())
    le = _new(
        Elementwise,
        id=0,
        target="aten.le.Tensor",
        inputs=ins,
        outputs=(mask,),
        fn="le",
        numel=q * kv,
        hidden=kv,
        call=AtenCall(args=({"tensor": 0}, {"tensor": 1})),
        **place,
    )
    return [arange(chunk.batch), arange(1), q_ar, q_idx, kv_ar, kv_idx, le]


def _repeat_kv(source: OpBase, attention: Attention, ids: _Ids) -> OpBase:
    """transformers' ``repeat_kv`` of the keys or values ``source`` appended: an expanded view copied."""
    b, kvh, keys, d = source.outputs[0].shape
    rep = attention.heads // attention.kv_heads
    shape = (b, kvh, rep, keys, d)
    view = source.outputs[0].model_copy(update={"shape": shape, "strides": (kvh * keys * d, keys * d, 0, d, 1)})
    out = TensorSpec(shape=shape, dtype=view.dtype, id=ids())
    call = AtenCall(args=({"tensor": 0},), keywords={"memory_format": "torch.contiguous_format"})
    return _new(
        Memory,
        id=0,
        target="aten.clone.default",
        inputs=(view,),
        outputs=(out,),
        scope=attention.scope,
        layer=attention.layer,
        stage=attention.stage,
        step=attention.step,
        dtype=view.dtype,
        fn="repeat_kv",
        numel=out.numel,
        call=call,
    )


def _masked_attention(op: Attention, mask: TensorSpec, kv: Sequence[OpBase], batch: int) -> OpBase:
    """``op`` given the expanded mask (and, after ``repeat_kv``, keys and values of every query head)."""
    q, keys = mask.shape[2], mask.shape[3]
    expanded = mask.model_copy(update={"shape": (batch, 1, q, keys), "strides": (0, q * keys, keys, 1)})
    ins = list(op.inputs[:3])
    for j, src in enumerate(kv, start=1):
        b, kvh, rep, n, d = src.outputs[0].shape
        ins[j] = src.outputs[0].model_copy(update={"shape": (b, kvh * rep, n, d)})
    updates: dict[str, Any] = {"inputs": (*ins, expanded)}
    if op.call is not None:
        kw = {k: v for k, v in op.call.keywords.items() if k != "enable_gqa"}
        kw.update(attn_mask={"tensor": 3}, is_causal=False)
        updates["call"] = op.call.model_copy(update={"keywords": kw})
    data = {k: v for k, v in op.__dict__.items() if k not in _DERIVED}
    data.update(updates)
    return OP_TYPES[op.kind].model_validate(data)


def add_prefix_masks(
    ops: Sequence[OpBase], edges: Sequence[Edge], chunks: Sequence[MaskedChunk]
) -> tuple[tuple[OpBase, ...], tuple[Edge, ...]]:
    """``ops`` (ids their positions) and ``edges`` with each chunk's mask ops after its ``after`` op, its
    ``repeat_kv`` copies before each of its attention ops, and those attention ops reading them; ops
    renumbered in order, edges kept (an append that fed an attention feeds its copy instead)."""
    if not chunks:
        return tuple(ops), tuple(edges)
    ids = _Ids(ops)
    after: dict[int, list[list[OpBase]]] = {}
    before: dict[int, list[OpBase]] = {}
    replaced: dict[int, OpBase] = {}
    extra: list[tuple[OpBase, OpBase, int | None]] = []  # (src, dst, tensor) among new or replaced ops
    dropped: set[tuple[int, int]] = set()
    for chunk in chunks:
        masks = _mask_ops(chunk, ops[chunk.after], ids)
        after.setdefault(chunk.after, []).append(masks)
        ar_q, add_q, ar_kv, add_kv, le = masks[2], masks[3], masks[4], masks[5], masks[6]
        extra += [(ar_q, add_q, ar_q.outputs[0].id), (ar_kv, add_kv, ar_kv.outputs[0].id)]
        extra += [(add_kv, le, add_kv.outputs[0].id), (add_q, le, add_q.outputs[0].id)]
        for a, sources in chunk.attention:
            att = ops[a]
            assert isinstance(att, Attention)
            copies = [_repeat_kv(ops[s], att, ids) for s in sources]
            before[a] = copies
            new = replaced[a] = _masked_attention(att, le.outputs[0], copies, chunk.batch)
            extra.append((le, new, le.outputs[0].id))
            for s, c in zip(sources, copies, strict=True):
                dropped.add((s, a))
                extra += [(ops[s], c, ops[s].outputs[0].id), (c, new, c.outputs[0].id)]
    out: list[OpBase] = []
    pos: dict[int, int] = {}  # python id of an emitted op -> its new id
    old: dict[int, int] = {}  # old op id -> new id

    def emit(o: OpBase) -> int:
        n = len(out)
        out.append(o if o.id == n else o.model_copy(update={"id": n}))
        pos[id(o)] = n
        return n

    for i, op in enumerate(ops):
        for c in before.get(i, ()):
            emit(c)
        new = replaced.get(i, op)
        old[op.id] = emit(new)
        pos[id(op)] = old[op.id]
        for group in after.get(i, ()):
            for m in group:
                emit(m)
    kept = [
        e.model_copy(update={"src": old[e.src], "dst": old[e.dst]})
        for e in edges
        if (e.src, e.dst) not in dropped or e.kind is not EdgeKind.DATA
    ]
    added = [Edge(src=pos[id(s)], dst=pos[id(d)], kind=EdgeKind.DATA, tensor=t) for s, d, t in extra]
    return tuple(out), tuple(kept + added)
