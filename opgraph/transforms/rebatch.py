"""Rebatch a captured prefill or decode graph to another batch shape, and build mixed serving steps.

A graph captured at one shape (``batch`` sequences of ``seq_len`` new tokens, or ``batch`` decodes
over ``kv_len`` cached tokens) holds the same ops at every shape: only the token, batch and kv-length
dimensions change. :func:`rebatch` rewrites them op by op and lets each op model recompute its
FLOPs, bytes and definition with its own methods, so a serving simulator pays for one capture per
phase instead of one per batch shape it meets.

How dimensions are rewritten:

- Every tensor dimension equal to a *source* size is mapped to the target size: prefill maps
  ``batch``, ``seq_len`` and ``batch * seq_len`` (flattened tokens); decode maps ``batch``,
  ``kv_len`` (the cache read) and ``kv_len + 1`` (the cache after the new token). The source sizes
  must differ from each other, from 1 and from every model size in the graph (hidden, heads,
  head_dim, GEMM n/k, vocab, experts), else :class:`RebatchError`: capture the template at odd
  sizes (``batch=7, seq_len=37``), which :data:`TEMPLATE_PREFILL`/:data:`TEMPLATE_DECODE` do.
- Kind fields that count tokens follow the same map (``Gemm.m``, ``Norm.rows``, ``Rope.tokens``,
  ``Embedding.tokens``, ``MoeRouting.tokens``, ``Softmax/TopK.rows``, ``Elementwise.hidden``; every
  size of a batched GEMM, a ``bmm`` of activations); element counts (``numel``) are recomputed from the
  rewritten output tensors.
- Attention gets ``batch``/``q_len``/``kv_len`` directly; its key/value inputs take ``kv_len`` on
  their sequence dimension (so a prefill template also gives a chunk over a cached prefix).
- Mixture-of-experts layers: per-expert rows are re-derived with the capture's balanced routing
  (:func:`opgraph.capture.moe_model.expert_counts` semantics, re-implemented here on plain ints);
  experts the new shape leaves idle keep their ops with zero rows (a fresh capture drops them); the
  ops between an experts call's GEMMs (its activation, transformers 5.17's masking) take the
  experts' rows; and the template's expert implementation is kept (a capture whose pairs split evenly over the
  experts records the batched ``bmm`` kernel instead of the per-expert loop).
- Collectives scale their payload with the token count.

>>> from opgraph.ir import GraphMetadata, Norm, OpGraph
>>> from opgraph.ir.graph import CaptureSettings
>>> md = GraphMetadata(phase="prefill", capture=CaptureSettings(batch=7, seq_len=37))
>>> g = OpGraph(metadata=md, ops=(Norm(id=0, rows=259, hidden=64),), edges=())
>>> rebatch(g, batch=2, q_len=10).ops[0].rows
20
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from opgraph.ir import OpgraphError
from opgraph.ir.graph import CaptureSettings, Edge, OpGraph
from opgraph.ir.ops import OP_TYPES, Attention, Collective, Gemm, MoeRouting, OpBase, OpKind, Stage
from opgraph.ir.tensor import TensorSpec

__all__ = [
    "TEMPLATE_DECODE",
    "TEMPLATE_PREFILL",
    "AttentionPart",
    "RebatchError",
    "balanced_expert_rows",
    "mixed_step",
    "rebatch",
    "source_shape",
]

TEMPLATE_PREFILL = {"batch": 7, "seq_len": 37}
"""Capture sizes of a prefill template: odd primes, distinct from model sizes (tokens 259)."""
TEMPLATE_DECODE = {"batch": 13, "kv_len": 41}
"""Capture sizes of a decode template (cache 41, attended 42)."""

# Kind fields that count tokens (or sequences): they follow the dimension map.
_TOKEN_FIELDS: dict[OpKind, tuple[str, ...]] = {
    OpKind.GEMM: ("m",),
    OpKind.NORM: ("rows",),
    OpKind.ROPE: ("tokens",),
    OpKind.EMBEDDING: ("tokens",),
    OpKind.MOE_ROUTING: ("tokens",),
    OpKind.SOFTMAX: ("rows",),
    OpKind.TOPK: ("rows",),
    OpKind.ELEMENTWISE: ("hidden",),
}
_PRODUCT_FIELDS = ("batch", "m", "n", "k")
"""A batched GEMM multiplies activations (eager attention's scores, the RoPE ``inv_freq @ position_ids``
of transformers 5.17, a ``bmm`` even over one batch): any of its sizes may count sequences or
tokens."""


def _token_fields(op: OpBase) -> tuple[str, ...]:
    if isinstance(op, Gemm) and (op.batch > 1 or "bmm" in op.target):
        return _PRODUCT_FIELDS
    return _TOKEN_FIELDS.get(op.kind, ())


# Kind fields that are model sizes: a source size equal to one of them would be ambiguous.
_MODEL_FIELDS = ("n", "k", "hidden", "heads", "kv_heads", "head_dim", "vocab", "experts", "top_k", "cols")
_DERIVED = {"flops", "bytes_read", "bytes_written", "definition"}
_PLACE = ("id", "target", "scope", "layer", "stage", "step", "call", "host_gap_us")


_M = TypeVar("_M", bound=BaseModel)


class RebatchError(OpgraphError):
    """A graph cannot be rebatched (unknown source shape, ambiguous sizes, an impossible target)."""


@dataclass(frozen=True)
class AttentionPart:
    """One attention group of a step: ``batch`` sequences of ``q_len`` new tokens over ``kv_len`` keys."""

    batch: int
    q_len: int
    kv_len: int


def source_shape(graph: OpGraph) -> tuple[str, int, int, int]:
    """(phase, batch, q_len, kv_len) the graph was captured at, from its capture settings.

    ``kv_len`` is what its attention reads: ``seq_len`` for a prefill, cache + 1 for a decode.
    """
    cap: CaptureSettings = graph.metadata.capture
    phase = graph.metadata.phase
    if phase == "prefill" and cap.seq_len:
        return phase, cap.batch or 1, cap.seq_len, cap.seq_len
    if phase == "decode" and cap.kv_len:
        return phase, cap.batch or 1, 1, cap.kv_len + 1
    raise RebatchError(
        f"graph phase {phase!r} cannot be rebatched",
        where="graph metadata",
        hint="capture a prefill or decode graph (not generate or trace)",
    )


def balanced_expert_rows(tokens: int, experts: int, top_k: int) -> list[int]:
    """Rows per expert under balanced routing, busiest first (all ``experts`` listed, idle ones 0).

    >>> balanced_expert_rows(15, 4, 2)
    [8, 8, 7, 7]
    >>> balanced_expert_rows(1, 4, 2)
    [1, 1, 0, 0]
    """
    pairs = tokens * top_k
    base, rem = divmod(pairs, experts)
    return [min(tokens, base + (1 if e < rem else 0)) for e in range(experts)]


def _dim_map(phase: str, b: int, q: int, kv: int, nb: int, nq: int, nkv: int) -> dict[int, int]:
    if phase == "prefill":
        return {b: nb, q: nq, b * q: nb * nq}
    return {b: nb, kv - 1: nkv - 1, kv: nkv}


_SIZES_CACHE: dict[int, tuple[OpGraph, frozenset[int]]] = {}


def _model_sizes(graph: OpGraph) -> frozenset[int]:
    """Model sizes of ``graph`` (memoised for the last few graphs: templates are rebatched many times)."""
    hit = _SIZES_CACHE.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    sizes = frozenset(
        v
        for op in graph.ops
        for f in _MODEL_FIELDS
        if f not in _token_fields(op) and isinstance(v := getattr(op, f, None), int)
    )
    if len(_SIZES_CACHE) >= 8:
        _SIZES_CACHE.pop(next(iter(_SIZES_CACHE)))
    _SIZES_CACHE[id(graph)] = (graph, sizes)
    return sizes


def _check_sources(graph: OpGraph, sources: Sequence[int]) -> None:
    if len(set(sources)) != len(sources) or min(sources) <= 1:
        raise RebatchError(
            f"template sizes {tuple(sources)} are ambiguous (equal to each other or to 1)",
            where="graph capture settings",
            hint="capture the template at distinct odd sizes, e.g. batch=7 seq_len=37",
        )
    model_sizes = _model_sizes(graph)
    clash = sorted(set(sources) & model_sizes)
    if clash:
        raise RebatchError(
            f"template size {clash[0]} is also a model size of this graph, so dimensions are ambiguous",
            where="graph capture settings",
            hint="capture the template at other sizes (odd primes such as 37 or 41 rarely clash)",
        )


def _map_tensor(t: TensorSpec, dims: dict[int, int]) -> TensorSpec:
    shape = tuple(dims.get(d, d) for d in t.shape)
    return t if shape == t.shape else t.model_copy(update={"shape": shape, "strides": None})


def _numel(ts: Iterable[TensorSpec]) -> int:
    return sum(t.numel for t in ts)


def _replace(obj: _M, updates: dict[str, Any]) -> _M:
    """A copy of the frozen model ``obj`` with ``updates`` (already valid), without pydantic's deep-ish copy.

    Rebatching copies every op of every layer; ``model_copy`` costs ~10x more and dominated it.
    """
    new = object.__new__(type(obj))
    data = dict(obj.__dict__)
    data.update(updates)
    object.__setattr__(new, "__dict__", data)
    fields_set = obj.__pydantic_fields_set__
    if not fields_set.issuperset(updates):
        fields_set = fields_set | set(updates)
    object.__setattr__(new, "__pydantic_fields_set__", fields_set)
    object.__setattr__(new, "__pydantic_extra__", None)
    object.__setattr__(new, "__pydantic_private__", None)
    return new


def _rebuild(op: OpBase, updates: dict[str, Any], keep_derived: Iterable[str] = ()) -> OpBase:
    data = {k: v for k, v in op.__dict__.items() if k not in _DERIVED or k in keep_derived}
    data.update(updates)
    return OP_TYPES[op.kind].model_validate(data)


class _Rewriter:
    """Rewrites ops of one graph for one target shape; keeps the per-expert bookkeeping of MoE layers."""

    def __init__(self, graph: OpGraph, batch: int, q_len: int, kv_len: int, tensor_ids: bool = True) -> None:
        self.phase, b, q, kv = source_shape(graph)
        self.dims = _dim_map(self.phase, b, q, kv, batch, q_len, kv_len)
        self.tokens_old, self.tokens_new = b * q, batch * q_len
        self.batch, self.q_len, self.kv_len = batch, q_len, kv_len
        self.src_kv = kv
        self.old_rows: list[int] = []
        self.new_rows: list[int] = []
        self.expert_of: dict[int, int] = {}
        self.act_index = 0
        self.in_moe = False
        self.done: dict[int, OpBase] = {}
        self.reps = _representatives(graph)
        self.tensor_ids = tensor_ids
        old_moe = [self._moe_rows(op, self.tokens_old) for op in graph.ops_of(OpKind.MOE_ROUTING)]
        moe_sizes = {r for rows in old_moe for r in rows}
        _check_sources(graph, list(dict.fromkeys(self.dims)) + sorted(moe_sizes - set(self.dims)))

    @staticmethod
    def _moe_rows(op: OpBase, tokens: int) -> list[int]:
        assert isinstance(op, MoeRouting)
        return [r for r in balanced_expert_rows(tokens, op.experts, op.top_k) if r > 0]

    def op(self, op: OpBase, index: int) -> OpBase:
        """``op`` (at ``index`` in the template) at the target shape. Ops equal but for their place
        (id, scope, layer, tensor ids), as every layer's are, are rewritten once and copied."""
        rep = self.reps[index]
        if rep < 0:
            return self._op(op)
        done = self.done.get(rep)
        if done is None:
            done = self.done[rep] = self._op(op)
            return done
        place = {k: getattr(op, k) for k in _PLACE}
        if self.tensor_ids:
            place["inputs"] = tuple(
                t if t.id == o.id else _replace(t, {"id": o.id}) for t, o in zip(done.inputs, op.inputs, strict=True)
            )
            place["outputs"] = tuple(
                t if t.id == o.id else _replace(t, {"id": o.id}) for t, o in zip(done.outputs, op.outputs, strict=True)
            )
        if isinstance(op, Attention):
            place["stage"] = done.stage
        return _replace(done, place)

    def _op(self, op: OpBase) -> OpBase:
        if isinstance(op, MoeRouting):
            return self._routing(op)
        if self.in_moe and op.kind in (OpKind.GEMM, OpKind.ACTIVATION, OpKind.ELEMENTWISE):
            return self._expert_op(op)
        if isinstance(op, Attention):
            return self._attention(op)
        ins = tuple(_map_tensor(t, self.dims) for t in op.inputs)
        outs = tuple(_map_tensor(t, self.dims) for t in op.outputs)
        updates: dict[str, Any] = {"inputs": ins, "outputs": outs}
        for f in _token_fields(op):
            v = getattr(op, f)
            updates[f] = self.dims.get(v, v)
        if hasattr(op, "numel") and op.outputs:
            updates["numel"] = self._scaled(op.numel, _numel(op.outputs), _numel(outs))
        if op.kind is OpKind.REDUCTION:
            updates["numel_in"] = self._scaled(op.numel_in, _numel(op.inputs), _numel(ins))  # type: ignore[attr-defined]
            updates["numel_out"] = self._scaled(op.numel_out, _numel(op.outputs), _numel(outs))  # type: ignore[attr-defined]
        if isinstance(op, Collective):
            updates["bytes"] = self._scaled(op.bytes, self.tokens_old, self.tokens_new)
        keep = ("flops",) if isinstance(op, Gemm) and "flops" in op.model_fields_set else ()
        if keep:
            assert isinstance(op, Gemm)
            old = math.prod(getattr(op, f) for f in _PRODUCT_FIELDS)
            updates["flops"] = self._scaled(
                op.flops, old, math.prod(updates.get(f, getattr(op, f)) for f in _PRODUCT_FIELDS)
            )
        return _rebuild(op, updates, keep)

    @staticmethod
    def _scaled(value: int, old: int, new: int) -> int:
        if old == 0:
            return value
        return value * new // old

    def _attention(self, op: Attention) -> OpBase:
        ins = list(op.inputs)
        for i, t in enumerate(ins):
            shape = list(t.shape)
            if len(shape) >= 2:
                if shape[0] == op.batch:
                    shape[0] = self.batch
                if i > 0 and shape[-2] == op.kv_len:  # keys and values: the attended length
                    shape[-2] = self.kv_len
                elif shape[-2] == op.q_len:
                    shape[-2] = self.q_len
            ins[i] = t.model_copy(update={"shape": tuple(shape), "strides": None})
        outs = []
        for t in op.outputs:
            shape = list(t.shape)
            if len(shape) >= 2:
                shape[0] = self.batch if shape[0] == op.batch else shape[0]
                shape[-2] = self.q_len if shape[-2] == op.q_len else shape[-2]
            outs.append(t.model_copy(update={"shape": tuple(shape), "strides": None}))
        stage = Stage.DECODE if self.q_len == 1 and self.kv_len > 1 else op.stage
        upd = {
            "batch": self.batch,
            "q_len": self.q_len,
            "kv_len": self.kv_len,
            "inputs": tuple(ins),
            "outputs": tuple(outs),
            "stage": stage,
        }
        return _rebuild(op, upd)

    def _routing(self, op: MoeRouting) -> OpBase:
        if op.fn == "dispatch":
            self.in_moe = True
            self.old_rows = balanced_expert_rows(self.tokens_old, op.experts, op.top_k)
            self.new_rows = balanced_expert_rows(self.tokens_new, op.experts, op.top_k)
            self.old_rows = [r for r in self.old_rows if r > 0]
            self.new_rows = self.new_rows[: len(self.old_rows)] + [0] * (len(self.old_rows) - len(self.new_rows))
            self.expert_of, self.act_index = {}, 0
        dims = dict(self.dims)
        dims[self.tokens_old * op.top_k] = self.tokens_new * op.top_k
        ins = self._expert_tensors(op.inputs, dims, None)
        outs = tuple(_map_tensor(t, dims) for t in op.outputs)
        if op.fn == "combine":
            self.in_moe = False
        return _rebuild(op, {"inputs": ins, "outputs": outs, "tokens": self.tokens_new})

    def _expert_tensors(
        self, ts: Sequence[TensorSpec], dims: dict[int, int], fixed: int | None
    ) -> tuple[TensorSpec, ...]:
        """Per-expert tensors (first dim an old expert row count) take the expert's new row count."""
        out: list[TensorSpec] = []
        pos = 0
        for t in ts:
            if self.in_moe and len(t.shape) == 2 and t.shape[0] in self.old_rows and t.shape[0] not in dims:
                e = self.expert_of.get(t.id) if t.id is not None else None
                if e is None:
                    e = fixed if fixed is not None else pos
                    if t.id is not None:
                        self.expert_of[t.id] = e
                pos += 1
                rows = self.new_rows[e] if e < len(self.new_rows) else 0
                out.append(t.model_copy(update={"shape": (rows, t.shape[1]), "strides": None}))
            else:
                out.append(_map_tensor(t, dims))
        return tuple(out)

    def _expert_op(self, op: OpBase) -> OpBase:
        fixed = None
        if op.kind is OpKind.ACTIVATION:
            fixed, self.act_index = self.act_index, self.act_index + 1
        pairs_old = sum(self.old_rows)
        pairs_new = sum(self.new_rows)
        dims = self.dims
        if pairs_old not in self.old_rows:  # a grouped kernel (and its gate) over all token-expert pairs
            dims = {**self.dims, pairs_old: pairs_new}
        ins = self._expert_tensors(op.inputs, dims, fixed)
        outs = self._expert_tensors(op.outputs, dims, fixed)
        if isinstance(op, Gemm):
            active = max(1, sum(1 for r in self.new_rows if r > 0))
            updates: dict[str, Any] = {"inputs": ins, "outputs": outs, "m": pairs_new // active, "groups": active}
            updates["flops"] = self._scaled(op.flops, pairs_old, pairs_new)
            return _rebuild(op, updates, ("flops", "definition"))
        return _rebuild(op, {"inputs": ins, "outputs": outs, "numel": _numel(outs)})


def _target(graph: OpGraph, batch: int, q_len: int | None, kv_len: int | None) -> tuple[str, int, int]:
    phase, _, q, kv = source_shape(graph)
    if phase == "decode":
        q_len = 1 if q_len is None else q_len
        if q_len != 1:
            raise RebatchError(f"a decode graph takes q_len=1 (got {q_len})", where="q_len", hint="use a prefill graph")
        kv_len = kv if kv_len is None else kv_len
    else:
        q_len = q if q_len is None else q_len
        kv_len = q_len if kv_len is None else kv_len
    if batch < 1 or q_len < 1 or kv_len < q_len:
        raise RebatchError(
            f"bad target shape batch={batch} q_len={q_len} kv_len={kv_len}",
            where="rebatch",
            hint="batch and q_len must be at least 1 and kv_len at least q_len",
        )
    if phase == "decode" and kv_len < 2:
        raise RebatchError("a decode step attends at least 2 keys (one cached)", where="kv_len")
    return phase, q_len, kv_len


def _attention_ops(graph: OpGraph, part: AttentionPart, tensor_ids: bool = True) -> list[OpBase]:
    """Only the attention ops of ``graph`` rebatched to ``part`` (what a mixed step takes from a template)."""
    _, q_len, kv_len = _target(graph, part.batch, part.q_len, part.kv_len)
    rw = _Rewriter(graph, part.batch, q_len, kv_len, tensor_ids)
    return [rw.op(op, i) for i, op in enumerate(graph.ops) if op.kind is OpKind.ATTENTION]


def _kv_dependent(graph: OpGraph) -> frozenset[int]:
    """Indices of the ops whose cost depends on ``kv_len`` at a fixed batch and ``q_len``."""
    hit = _KV_CACHE.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    phase, _, _, kv = source_shape(graph)
    kv_dims = {kv - 1, kv} if phase == "decode" else set()
    found = frozenset(
        i
        for i, op in enumerate(graph.ops)
        if op.kind is OpKind.ATTENTION or any(d in kv_dims for t in (*op.inputs, *op.outputs) for d in t.shape)
    )
    if len(_KV_CACHE) >= 8:
        _KV_CACHE.pop(next(iter(_KV_CACHE)))
    _KV_CACHE[id(graph)] = (graph, found)
    return found


_KV_CACHE: dict[int, tuple[OpGraph, frozenset[int]]] = {}
_REPS_CACHE: dict[int, tuple[OpGraph, list[int]]] = {}


def _representatives(graph: OpGraph) -> list[int]:
    """For each op, the index of the first op equal to it but for its place; -1 for MoE-layer ops
    (rewritten one by one: their per-expert rows depend on their position). Memoised per template."""
    hit = _REPS_CACHE.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    first: dict[Any, int] = {}
    reps: list[int] = []
    in_moe = False
    for i, op in enumerate(graph.ops):
        if isinstance(op, MoeRouting):
            in_moe = op.fn != "combine" and (in_moe or op.fn == "dispatch")
            reps.append(-1)
            continue
        if in_moe:
            reps.append(-1)
            continue
        key = (
            tuple((k, v) for k, v in op.__dict__.items() if k not in _PLACE and k not in ("inputs", "outputs")),
            tuple((t.shape, t.dtype) for t in op.inputs),
            tuple((t.shape, t.dtype) for t in op.outputs),
        )
        reps.append(first.setdefault(key, i))
    if len(_REPS_CACHE) >= 8:
        _REPS_CACHE.pop(next(iter(_REPS_CACHE)))
    _REPS_CACHE[id(graph)] = (graph, reps)
    return reps


def rebatch(
    graph: OpGraph,
    *,
    batch: int,
    q_len: int | None = None,
    kv_len: int | None = None,
    like: OpGraph | None = None,
    tensor_ids: bool = True,
) -> OpGraph:
    """``graph`` (a captured prefill or decode) at ``batch`` sequences of ``q_len`` new tokens over ``kv_len``.

    A decode graph takes ``q_len=1`` (the default) and ``kv_len`` keys attended (cache + the new
    token); a prefill graph takes ``q_len`` new tokens and ``kv_len`` keys (default ``q_len``: no
    cached prefix; larger: a chunk over a prefix). Ops keep their ids, order and edges; FLOPs,
    bytes and definitions are recomputed by the op models. ``like``, a rebatch of the same
    ``graph`` at the same ``batch`` and ``q_len`` (any ``kv_len``), lends the ops that do not depend
    on ``kv_len``, so only attention and KV-cache ops are rewritten (a serving simulator walking
    kv lengths at one batch size). ``tensor_ids=False`` lets ops repeated across layers share the
    rewritten tensors of the first one (their ids too): costs are the same and rebatching is faster,
    but tensor ids no longer trace data flow (edges still do); for graphs that are only simulated.
    Raises :class:`RebatchError`.
    """
    phase, q_len, kv_len = _target(graph, batch, q_len, kv_len)
    rw = _Rewriter(graph, batch, q_len, kv_len, tensor_ids)
    if like is None:
        ops = tuple(rw.op(op, i) for i, op in enumerate(graph.ops))
    else:
        lc = like.metadata.capture
        same_q = lc.seq_len == q_len if phase == "prefill" else True
        if len(like.ops) != len(graph.ops) or lc.batch != batch or not same_q:
            raise RebatchError(
                "`like` is not a rebatch of this graph at the same batch and q_len", where="rebatch(like=...)"
            )
        dependent = _kv_dependent(graph)
        ops = tuple(rw.op(op, i) if i in dependent else like.ops[i] for i, op in enumerate(graph.ops))
    cap = graph.metadata.capture.model_copy(
        update={
            "batch": batch,
            "seq_len": q_len if phase == "prefill" else None,
            "kv_len": kv_len - 1 if phase == "decode" else None,
        }
    )
    md = graph.metadata.model_copy(update={"capture": cap})
    return OpGraph.model_construct(metadata=md, ops=ops, edges=graph.edges)  # type: ignore[arg-type]


def mixed_step(
    prefill: OpGraph,
    decode: OpGraph,
    parts: Sequence[AttentionPart],
    decode_part: AttentionPart | None,
    *,
    base: OpGraph | None = None,
    tensor_ids: bool = True,
) -> OpGraph:
    """One serving step holding prefill chunks and decodes, as one graph of the real model.

    Token-wise ops (linears, norms, activations, embedding, MoE) run once over all the step's
    tokens (the prefill template rebatched to one sequence of ``sum(chunk tokens) + decodes``
    tokens), as a serving engine batches them; each attention op of the template becomes one
    attention op per prefill part (the chunk over its prefix) plus one decode attention op
    (``decode_part``: decodes over their mean kv length, which keeps the keys read and the FLOPs),
    taken from ``decode`` rebatched to that shape and joined with the same edges. ``base`` is the
    token-wise graph when the caller has it already (``rebatch(prefill, batch=1, q_len=tokens)``);
    ``tensor_ids`` as for :func:`rebatch`.
    """
    if not parts and decode_part is None:
        raise RebatchError("a step needs at least one prefill part or decode", where="mixed_step")
    tokens = sum(p.batch * p.q_len for p in parts) + (decode_part.batch if decode_part else 0)
    if base is None:
        base = rebatch(prefill, batch=1, q_len=tokens, tensor_ids=tensor_ids)
    elif base.metadata.capture.seq_len != tokens or base.metadata.capture.batch != 1:
        raise RebatchError(f"base graph is not the prefill at one sequence of {tokens} tokens", where="mixed_step")
    groups: list[list[OpBase]] = []
    for p in parts:
        groups.append(_attention_ops(prefill, p, tensor_ids))
    if decode_part is not None:
        groups.append(_attention_ops(decode, AttentionPart(decode_part.batch, 1, decode_part.kv_len), tensor_ids))
    attn = base.ops_of(OpKind.ATTENTION)
    if any(len(grp) != len(attn) for grp in groups):
        raise RebatchError(
            "the prefill and decode templates have different attention layers",
            where="mixed_step",
            hint="capture both templates from the same model and layer count",
        )
    index_of = {op.id: i for i, op in enumerate(attn)}
    new_ops: list[OpBase] = []
    new_id: dict[int, list[int]] = {}
    for op in base.ops:
        if op.id in index_of:
            ids = []
            for grp in groups:
                nid = len(new_ops)
                new_ops.append(_replace(grp[index_of[op.id]], {"id": nid}))
                ids.append(nid)
            new_id[op.id] = ids
        else:
            nid = len(new_ops)
            new_ops.append(_replace(op, {"id": nid}))
            new_id[op.id] = [nid]
    edges: list[Edge] = []
    for e in base.edges:
        for s in new_id[e.src]:
            for d in new_id[e.dst]:
                edges.append(_replace(e, {"src": s, "dst": d}))
    return OpGraph.model_construct(metadata=base.metadata, ops=tuple(new_ops), edges=tuple(edges))  # type: ignore[arg-type]
