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

A sliding-window SDPA layer (``Attention.window``) takes a mask of its own,
``create_sliding_window_causal_mask``, over the keys its capped cache holds: built wherever the full
mask is, and also for a prompt of at least the window's length without a prefix (transformers skips it
only where queries and keys have one length and that length is below the window). Its ops: the same
aranges and offsets (the keys' offset by those the cache dropped), a ``new_ones`` scalar, ``q - window``
(a ``sub``), ``kv > q - window`` (a ``gt``), then the two ``bitwise_and`` of ``and_masks`` around the
causal ``le``. One mask per window, after the full one. A model that builds the full mask though none of
its layers reads it (transformers' Qwen2 with every layer sliding) gets none here. Templates that
already pass a mask (eager attention) are left as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opgraph.ir.dtypes import DType
from opgraph.ir.graph import Edge, EdgeKind, OpGraph
from opgraph.ir.ops import OP_TYPES, AtenCall, Attention, Elementwise, Memory, OpBase, scalar_operand
from opgraph.ir.tensor import TensorSpec
from opgraph.transforms.rebatch_moe import graph_memo

__all__ = ["MaskPlan", "MaskedChunk", "add_prefix_masks", "mask_plan", "window_mask_needed"]

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
    windows: tuple[int | None, ...] = ()
    """Each attention's sliding window (``None``: full attention), as :attr:`attention` lists them."""

    def needs_mask(self, q_len: int, kv_len: int) -> bool:
        """Whether a chunk of ``q_len`` tokens over ``kv_len`` keys builds a mask: over a prefix, or a
        prompt as long as some layer's window (:func:`window_mask_needed`)."""
        return any(window_mask_needed(q_len, kv_len, w) for w in (*self.windows, None))


def window_mask_needed(q_len: int, keys: int, window: int | None) -> bool:
    """Whether transformers builds the mask of attention over ``keys`` keys (its capped cache's, for a
    sliding ``window``) for ``q_len`` queries: unless both have one length and, for a window, that length
    is below it.

    >>> window_mask_needed(40, 40, 48), window_mask_needed(48, 48, 48), window_mask_needed(11, 31, None)
    (False, True, True)
    """
    return keys != q_len or (window is not None and q_len >= window)


@dataclass(frozen=True)
class MaskedChunk:
    """One chunk of a rebatched graph that may take masks: ``batch`` sequences of ``q_len`` tokens over
    ``kv_len`` keys, its attention ops and their key/value producers by op id in that graph, and each
    attention's sliding window (``None``: full; a sliding layer's keys are its rebatched op's)."""

    batch: int
    q_len: int
    kv_len: int
    after: int
    attention: tuple[tuple[int, tuple[int, ...]], ...]
    windows: tuple[int | None, ...] = ()


_PLAN_CACHE: dict[int, tuple[OpGraph, MaskPlan | None]] = {}


def mask_plan(graph: OpGraph) -> MaskPlan | None:
    """The :class:`MaskPlan` of a prefill template, or ``None`` where it has no unmasked causal SDPA of a
    full-attention layer (memoised)."""
    return graph_memo(_PLAN_CACHE, graph, _build_plan)


def _maskless(op: OpBase) -> bool:
    if not isinstance(op, Attention):
        return False
    return op.target == SDPA and op.causal and op.q_len == op.kv_len and len(op.inputs) == 3


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
    windows: list[int | None] = []
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
        windows.append(op.window)
    return MaskPlan(after, tuple(plan), tuple(windows))


def _new(kind_op: type[OpBase], **fields: Any) -> OpBase:
    return kind_op.model_validate(fields)


class _Ids:
    def __init__(self, ops: Sequence[OpBase]) -> None:
        self.next = 1 + max((t.id for op in ops for t in (*op.inputs, *op.outputs) if t.id is not None), default=-1)

    def __call__(self) -> int:
        self.next += 1
        return self.next - 1


def _mask_ops(chunk: MaskedChunk, keys: int, window: int | None, like: OpBase, ids: _Ids) -> list[OpBase]:
    """The ops of ``sdpa_mask`` for ``chunk`` over ``keys`` keys (the last ``keys`` of its ``kv_len``), with a
    sliding ``window`` or none (``like`` gives their scope, stage and step); the last is the mask."""
    place = {"scope": like.scope, "stage": like.stage, "step": like.step, "dtype": DType.fp32}
    idx, boolean = DType("int64"), DType("bool")

    def arange(n: int) -> OpBase:
        out = TensorSpec(shape=(n,), dtype=idx, id=ids())
        call = AtenCall(args=(n,), keywords={"pin_memory": False})
        return _new(Memory, id=0, target="aten.arange.default", outputs=(out,), fn="fill", numel=n, call=call, **place)

    def elementwise(fn: str, ins: tuple[TensorSpec, ...], shape: tuple[int, ...], by: Any = None) -> OpBase:
        """``aten.{fn}.Tensor`` of ``ins`` (and the scalar ``by``) into a tensor of ``shape``."""
        dtype = boolean if fn in ("le", "gt", "bitwise_and") else idx
        out = TensorSpec(shape=shape, dtype=dtype, id=ids())
        args: tuple[Any, ...] = tuple({"tensor": j} for j in range(len(ins))) + (() if by is None else (by,))
        n = math.prod(shape)
        scalar = scalar_operand(fn, [t.numel for t in ins], n)
        return _new(
            Elementwise, id=0, target=f"aten.{fn}.Tensor", inputs=ins, outputs=(out,), fn=fn,
            numel=n, hidden=shape[-1], scalar=scalar, call=AtenCall(args=args), **place,
        )  # fmt: skip

    q, kv = chunk.q_len, chunk.kv_len
    q_ar, kv_ar = arange(q), arange(keys)
    q_idx = elementwise("add", q_ar.outputs, (q,), kv - q)
    kv_idx = elementwise("add", kv_ar.outputs, (keys,), kv - keys)
    kv_row = kv_idx.outputs[0].model_copy(update={"shape": (1, 1, 1, keys)})
    q_col = q_idx.outputs[0].model_copy(update={"shape": (1, 1, q, 1)})
    grid = (1, 1, q, keys)
    le = elementwise("le", (kv_row, q_col), grid)
    head = [arange(chunk.batch), arange(1), q_ar, q_idx, kv_ar, kv_idx]
    if window is None:
        return [*head, le]
    # and_masks(sliding_window_overlay(window), causal): True & (kv > q - window) & (kv <= q)
    scalar = TensorSpec(shape=(), dtype=boolean, id=ids())
    call = AtenCall(args=({"tensor": 0}, []), keywords={"dtype": {"dtype": "bool"}, "pin_memory": False})
    ones = _new(
        Memory, id=0, target="aten.new_ones.default", inputs=(q_col,), outputs=(scalar,), fn="fill", numel=1,
        call=call, **place,
    )  # fmt: skip
    low = elementwise("sub", (q_col,), (1, 1, q, 1), window)
    inside = elementwise("gt", (kv_row, low.outputs[0]), grid)
    both = elementwise("bitwise_and", (scalar, inside.outputs[0]), grid)
    mask = elementwise("bitwise_and", (both.outputs[0], le.outputs[0]), grid)
    return [*head, ones, low, inside, both, le, mask]


def _mask_edges(masks: Sequence[OpBase]) -> list[tuple[OpBase, OpBase, int | None]]:
    """The data edges among :func:`_mask_ops`' ops (each op's inputs from the ops that made them)."""
    made = {t.id: m for m in masks for t in m.outputs}
    return [(made[t.id], m, t.id) for m in masks for t in m.inputs if t.id in made]


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
        windows = chunk.windows or (None,) * len(chunk.attention)
        groups: dict[int | None, list[tuple[int, tuple[int, ...]]]] = {}
        for entry, window in zip(chunk.attention, windows, strict=True):
            groups.setdefault(window, []).append(entry)
        # the full mask first, then one per window (as transformers' models build their mask mapping)
        for window in sorted(groups, key=lambda w: -1 if w is None else w):
            members = groups[window]
            first = ops[members[0][0]]
            assert isinstance(first, Attention)
            keys = chunk.kv_len if window is None else first.kv_len
            if not window_mask_needed(chunk.q_len, keys, window):
                continue
            masks = _mask_ops(chunk, keys, window, ops[chunk.after], ids)
            after.setdefault(chunk.after, []).append(masks)
            extra += _mask_edges(masks)
            mask = masks[-1]
            for a, sources in members:
                att = ops[a]
                assert isinstance(att, Attention)
                copies = [_repeat_kv(ops[s], att, ids) for s in sources]
                before[a] = copies
                new = replaced[a] = _masked_attention(att, mask.outputs[0], copies, chunk.batch)
                extra.append((mask, new, mask.outputs[0].id))
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
