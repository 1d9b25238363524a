"""Rebatch a captured prefill or decode graph to another batch shape, and build mixed serving steps.

A graph captured at one shape (``batch`` sequences of ``seq_len`` new tokens, or ``batch`` decodes
over ``kv_len`` cached tokens) holds the same ops at every shape: only the token, batch and kv-length
dimensions change. :func:`rebatch` rewrites them op by op and lets each op model recompute its
FLOPs, bytes and definition with its own methods, so a serving simulator pays for one capture per
phase instead of one per batch shape it meets.

How dimensions are rewritten:

- Every tensor dimension equal to a *source* size is mapped to the target size: prefill maps
  ``batch``, ``seq_len`` and ``batch * seq_len`` (flattened tokens); decode maps ``batch``,
  ``kv_len`` (the cache read) and ``kv_len + 1`` (the cache after the new token); inside an experts
  call, its token-expert pairs (``tokens * top_k``) too. The source sizes must differ from each
  other, from 1 and from every model size in the graph (hidden, heads, head_dim, GEMM n/k, vocab,
  experts), else :class:`RebatchError`: capture the template at odd sizes (``batch=7, seq_len=37``),
  which :data:`TEMPLATE_PREFILL`/:data:`TEMPLATE_DECODE` do, or at those :func:`template_shape` picks
  for a model they clash with (:func:`check_template` says whether a template serves every shape).
- Kind fields that count tokens follow the same map (``Gemm.m``, ``Norm.rows``, ``Rope.tokens``,
  ``Embedding.tokens``, ``MoeRouting.tokens``, ``Softmax/TopK.rows``, ``Elementwise.hidden``; every
  size of a batched GEMM, a ``bmm`` of activations); rows that count tokens times heads (Qwen3's
  per-head norms) grow with their input; element counts (``numel``) are recomputed from the rewritten
  output tensors.
- Attention gets ``batch``/``q_len``/``kv_len`` directly; its key/value inputs take ``kv_len`` on
  their sequence dimension (so a prefill template also gives a chunk over a cached prefix).
- What runs over the cached keys rather than the new tokens follows ``kv_len`` too. In a decode
  template the cache sizes say so; in a prefill template, where keys and queries have one length,
  the ops from each KV-cache append (``cat`` of the new tokens to the empty cache) to the attention
  do: the append's output and, with MLA, the up-projection of the whole latent cache (``kv_b_proj``)
  and the copies that build keys and values from it, as transformers runs a chunk over a cached
  prefix (``batch x (prefix + chunk)`` rows, as in a decode).
- A sliding-window layer (its ``Attention.window``) reads at most the window's keys: a decode's
  cache holds ``window - 1`` tokens plus the new one, a chunk of ``q`` tokens reads ``window - 1 + q``
  keys (transformers' ``DynamicSlidingWindowLayer``). Its attention and its cache ops take
  ``min(kv_len, window - 1 + q_len)`` keys; the window still masks the queries of a long chunk.
  A batch of decodes over their mean ``kv_len`` reads, in a sliding layer, the mean of the capped
  lengths, which is shorter when some caches are shorter than the window and some longer:
  ``window_kv`` gives those keys per window (:func:`template_windows` lists a template's windows).
- A chunk over a prefix builds the causal mask that transformers skips in a prefill template (SDPA's
  causal flag): its ops, the mask each full layer's SDPA reads and, with GQA, the copies of keys and
  values to every query head (:mod:`opgraph.transforms.rebatch_mask`), once per chunk of a mixed step.
- Mixture-of-experts calls (:mod:`opgraph.transforms.rebatch_moe`): rows per expert are not template
  sizes but derived ones, re-routed for the new token count by the capture's own routing model
  (:func:`opgraph.capture.moe_model.expert_counts`, balanced or the template's ``moe_skew``). A
  grouped GEMM takes the new mean rows, active experts and the bytes of their weights; a call with
  one GEMM per expert gives the ``j``-th GEMM (and the ops on its rows) the ``j``-th busiest expert's
  rows, and drops those of experts the new shape leaves idle, as a fresh capture does (the ops after
  them are renumbered, and edges through them kept as order edges). Such a template must have GEMMs
  for every expert the target routes to (:class:`RebatchError` otherwise), so serving templates are
  captured with enough tokens to reach every expert. The template's experts implementation is kept
  (a capture whose pairs split evenly over the experts records the batched ``bmm`` kernel instead).
- Collectives scale their payload with the token count.

>>> from opgraph.ir import GraphMetadata, Norm, OpGraph
>>> from opgraph.ir.graph import CaptureSettings
>>> md = GraphMetadata(phase="prefill", capture=CaptureSettings(batch=7, seq_len=37))
>>> g = OpGraph(metadata=md, ops=(Norm(id=0, rows=259, hidden=64),), edges=())
>>> rebatch(g, batch=2, q_len=10).ops[0].rows
20
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from opgraph.ir import OpgraphError
from opgraph.ir.configs import contiguous_strides
from opgraph.ir.graph import CaptureSettings, Edge, EdgeKind, OpGraph
from opgraph.ir.ops import OP_TYPES, Attention, Collective, Gemm, Memory, MoeRouting, OpBase, OpKind, Stage
from opgraph.ir.tensor import TensorSpec
from opgraph.transforms.rebatch_mask import MaskedChunk, add_prefix_masks, mask_plan
from opgraph.transforms.rebatch_moe import graph_memo, moe_layout, routed_rows, tokens_reaching_all

__all__ = [
    "TEMPLATE_DECODE",
    "TEMPLATE_PREFILL",
    "AttentionPart",
    "RebatchError",
    "check_template",
    "mixed_step",
    "rebatch",
    "source_shape",
    "template_shape",
    "template_windows",
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
_T = TypeVar("_T")
_Role = Literal["tokens", "keys", "append", "mask"]
"""How :class:`_Rewriter` rewrites an op: over the new tokens, over the keys, a KV-cache append (new
tokens in, keys out), or an op outside the layers that builds an attention mask (some dimensions over
the keys, the others over the tokens)."""
_Dims = tuple[frozenset[int], ...]
"""The positions of the key dimensions of each tensor of an op (inputs or outputs)."""


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


def _odd_primes(start: int) -> Iterator[int]:
    """Odd primes from ``start`` on (odd primes rarely equal a model size or a product of two)."""
    n = max(3, start)
    while True:
        if n % 2 and all(n % d for d in range(3, math.isqrt(n) + 1, 2)):
            yield n
        n += 1


def check_template(graph: OpGraph) -> None:
    """Raise :class:`RebatchError` unless ``graph`` can be rebatched to every shape: a prefill or decode
    graph whose capture sizes are unambiguous, and whose experts calls with one GEMM per expert have
    GEMMs for every expert."""
    _, b, q, _ = source_shape(graph)
    _Rewriter(graph, b, q, q if graph.metadata.phase == "prefill" else 2)
    for sec in moe_layout(graph).sections:
        if sec.expert_rows and len(sec.expert_rows) < sec.experts:
            need = tokens_reaching_all(sec.experts, sec.top_k, sec.layer + 1)
            raise RebatchError(
                f"the template's experts call has GEMMs for {len(sec.expert_rows)} of {sec.experts} experts, "
                "so it cannot be rebatched to shapes that reach the others",
                where="graph capture settings",
                hint=f"capture the template with at least {need} tokens (balanced routing then reaches every expert)",
            )


def template_shape(phase: str, refused: OpGraph | None = None) -> dict[str, int]:
    """Capture sizes of a ``phase`` template: :data:`TEMPLATE_PREFILL`/:data:`TEMPLATE_DECODE`, or, given
    a template of the model that :func:`check_template` ``refused``, the first odd primes that avoid
    its model sizes and give each experts call with one GEMM per expert enough tokens to reach every
    expert.

    >>> template_shape("decode")
    {'batch': 13, 'kv_len': 41}
    """
    base = TEMPLATE_PREFILL if phase == "prefill" else TEMPLATE_DECODE
    size_key = "seq_len" if phase == "prefill" else "kv_len"
    if refused is None:
        return dict(base)
    avoid = _model_sizes(refused)
    sections = moe_layout(refused).sections
    need = max((tokens_reaching_all(s.experts, s.top_k, s.layer + 1) for s in sections if s.expert_rows), default=1)
    top_ks = {s.top_k for s in sections if s.top_k > 1}
    sizes = [p for p, _ in zip(_odd_primes(base[size_key]), range(8), strict=False)]
    for batch in _odd_primes(base["batch"]):
        for size in sizes:
            tokens = batch * size if phase == "prefill" else batch
            if tokens < need:
                continue
            if phase == "prefill":
                sources = [batch, size, batch * size]
            else:  # as _dim_map's: the batch, the cache before and after the new token, and batch x each
                sources = [batch, size, size + 1, batch * size, batch * (size + 1)]
            sources += [tokens * k for k in sorted(top_ks)]
            if len(set(sources)) == len(sources) and not set(sources) & avoid:
                return {"batch": batch, size_key: size}
    raise AssertionError("unreachable: odd primes never run out")  # pragma: no cover


def template_windows(graph: OpGraph) -> tuple[int, ...]:
    """The distinct sliding windows of a prefill or decode template's layers, ascending (none: ``()``).

    >>> from opgraph.ir import Attention, GraphMetadata, OpGraph
    >>> from opgraph.ir.graph import CaptureSettings
    >>> md = GraphMetadata(phase="decode", capture=CaptureSettings(batch=13, kv_len=41))
    >>> att = dict(batch=13, heads=4, kv_heads=4, head_dim=16, q_len=1, kv_len=42)
    >>> ops = tuple(Attention(id=i, layer=i, window=w, **att) for i, w in enumerate((128, None, 128)))
    >>> template_windows(OpGraph(metadata=md, ops=ops, edges=()))
    (128,)
    """
    layout = _kv_layout(graph)
    windows = {*layout.windows.values(), *(op.window for op in graph.ops if isinstance(op, Attention) and op.window)}
    return tuple(sorted(windows))


def _dim_map(phase: str, b: int, q: int, kv: int, nb: int, nq: int, nkv: int) -> dict[int, int]:
    if phase == "prefill":
        return {b: nb, q: nq, b * q: nb * nq}
    # MLA (transformers 5.18 on) up-projects the whole latent cache every step: batch x cache rows.
    return {b: nb, kv - 1: nkv - 1, kv: nkv, b * (kv - 1): nb * (nkv - 1), b * kv: nb * nkv}


_SIZES_CACHE: dict[int, tuple[OpGraph, frozenset[int]]] = {}


def _model_sizes(graph: OpGraph) -> frozenset[int]:
    """Model sizes of ``graph`` (memoised)."""

    def build(g: OpGraph) -> frozenset[int]:
        return frozenset(
            v
            for op in g.ops
            for f in _MODEL_FIELDS
            if f not in _token_fields(op) and isinstance(v := getattr(op, f, None), int)
        )

    return graph_memo(_SIZES_CACHE, graph, build)


@dataclass(frozen=True)
class _KvLayout:
    """What of a template depends on the keys rather than the new tokens."""

    windows: dict[int, int]
    """Sliding window of each layer that has one."""
    outside: dict[int, int]
    """Indices of the ops outside the layers that feed sliding layers of one window only (its
    sliding-window mask), with that window."""
    key_side: frozenset[int]
    """Prefill: indices of the ops that run over the keys, from each KV-cache append to (not including)
    the attention it feeds."""
    appends: frozenset[int]
    """Prefill: the KV-cache appends among them (new tokens in, keys out)."""
    mask: dict[int, tuple[_Dims, _Dims]]
    """Prefill: indices of the ops outside the layers whose data reaches a key dimension of an attention
    operand (the mask eager attention reads: ``[b, 1, q, keys]``), with the key dimensions of each of
    their inputs and outputs (:func:`_mask_dims`)."""
    kv_dependent: frozenset[int]
    """Indices of the ops whose cost depends on ``kv_len`` at a fixed batch and ``q_len``."""


_LAYOUT_CACHE: dict[int, tuple[OpGraph, _KvLayout]] = {}


def _kv_layout(graph: OpGraph) -> _KvLayout:
    """The :class:`_KvLayout` of a prefill or decode template (memoised)."""
    return graph_memo(_LAYOUT_CACHE, graph, _build_kv_layout)


def _build_kv_layout(graph: OpGraph) -> _KvLayout:
    phase, b, q, kv = source_shape(graph)
    ops = graph.ops
    attention = {i for i, op in enumerate(ops) if isinstance(op, Attention)}
    windows: dict[int, int] = {}
    for i in attention:
        op = ops[i]
        assert isinstance(op, Attention)
        window = op.window
        if window is None and phase == "decode" and op.kv_len < kv:  # a capture that records only masking windows
            window = op.kv_len  # its sliding cache, capped at the window
        if window is not None and op.layer is not None:
            windows[op.layer] = window
    index = {op.id: i for i, op in enumerate(ops)}
    edges = [(index[e.src], index[e.dst]) for e in graph.edges if e.kind is EdgeKind.DATA]
    if phase == "decode":
        kv_dims = {kv - 1, kv, b * (kv - 1), b * kv}  # as _dim_map's: MLA up-projects batch x cache rows
        dependent = {
            i for i, op in enumerate(ops) if any(d in kv_dims for t in (*op.inputs, *op.outputs) for d in t.shape)
        }
        outside = _outside_windows(ops, edges, attention, windows) if windows else {}
        return _KvLayout(windows, outside, frozenset(), frozenset(), {}, frozenset(attention | dependent))
    # A prefill appends its new keys to an empty cache (an input of no elements); what runs from there to
    # the attention of the same layer runs over the keys. Data edges only, within the layer.
    succ: dict[int, list[int]] = {}
    pred: dict[int, list[int]] = {}
    for s, d in edges:
        if ops[s].layer is not None and ops[s].layer == ops[d].layer:
            succ.setdefault(s, []).append(d)
            pred.setdefault(d, []).append(s)
    appends = {
        i
        for i, op in enumerate(ops)
        if op.layer is not None and i not in attention and op.outputs and any(t.numel == 0 for t in op.inputs)
    }
    reached = _reach(appends, succ, attention)
    feeding = _reach(attention & reached, {d: [s for s in ss if s in reached] for d, ss in pred.items()}, set())
    key_side = frozenset(feeding - attention)
    mask = _mask_dims(ops, graph.edges, index, sorted(attention), q)
    outside = _outside_windows(ops, edges, attention, windows) if windows and mask else {}
    return _KvLayout(
        windows, outside, key_side, frozenset(appends & key_side), mask, frozenset(attention | key_side | set(mask))
    )


def _outside_windows(
    ops: Sequence[OpBase], edges: Iterable[tuple[int, int]], attention: Iterable[int], windows: dict[int, int]
) -> dict[int, int]:
    """Ops outside the layers whose data reaches the attention of sliding layers of one window only
    (through ops outside the layers: a decode's sliding-window mask), with that window."""
    pred: dict[int, list[int]] = {}
    for s, d in edges:
        if ops[s].layer is None:
            pred.setdefault(d, []).append(s)
    fed: dict[int, set[int | None]] = {}  # the windows of the attention each op feeds (None: a full layer)
    for a in attention:
        layer = ops[a].layer
        for i in _reach([a], pred, set()) - {a}:
            fed.setdefault(i, set()).add(None if layer is None else windows.get(layer))
    return {i: w for i, ws in fed.items() if len(ws) == 1 and (w := next(iter(ws))) is not None}


def _mask_dims(
    ops: Sequence[OpBase], edges: Iterable[Edge], index: Mapping[int, int], attention: Sequence[int], q: int
) -> dict[int, tuple[_Dims, _Dims]]:
    """Prefill: the ops outside the layers whose data reaches a key dimension of an attention operand, with
    the key dimensions of each of their inputs and outputs. In a template queries and keys have one
    length ``q``; which of an op's ``q``-sized dimensions are keys follows the data backwards from each
    attention (its operands' key dimensions, :func:`_sequence_dims`): an elementwise or memory op
    broadcasts its inputs to its output (aligned on the right), a view keeps the order of the
    ``q``-sized dimensions. A dimension that any consumer reads over the tokens stays over the tokens.

    >>> from opgraph.ir.ops import Elementwise
    >>> md = dict(batch=7, heads=4, kv_heads=4, head_dim=16, q_len=37, kv_len=37, layer=0)
    >>> mask = TensorSpec(shape=(7, 1, 37, 37), dtype="bool", id=1)
    >>> le = Elementwise(id=0, fn="le", numel=7 * 37 * 37, hidden=37, outputs=(mask,))
    >>> att = Attention(id=1, inputs=(TensorSpec(shape=(7, 4, 37, 16), dtype="bf16", id=0), mask), **md)
    >>> edge = Edge(src=0, dst=1, kind=EdgeKind.DATA, tensor=1)
    >>> _mask_dims((le, att), [edge], {0: 0, 1: 1}, [1], 37)
    {0: ((), (frozenset({3}),))}
    """
    into: dict[int, list[tuple[int, int]]] = {}  # producer outside the layers -> (consumer, tensor id)
    for e in edges:
        if e.kind is EdgeKind.DATA and e.tensor is not None and ops[index[e.src]].layer is None:
            into.setdefault(index[e.src], []).append((index[e.dst], e.tensor))
    wanted: dict[int, _Dims] = {}  # the key dimensions of each input of an op, as the op reads it
    for a in attention:
        op = ops[a]
        assert isinstance(op, Attention)
        wanted[a] = tuple(
            frozenset(i for i, key in _sequence_dims(op, t, query=j == 0) if key) for j, t in enumerate(op.inputs)
        )
    found: dict[int, tuple[_Dims, _Dims]] = {}
    for p in sorted(into, reverse=True):  # a consumer follows its producers
        op = ops[p]
        keys: dict[int, set[int]] = {}
        tokens: dict[int, set[int]] = {}
        for c, tid in into[p]:
            out = next((t for t in op.outputs if t.id == tid), None)
            if out is None:
                continue
            for j, t in enumerate(ops[c].inputs):
                if t.id != tid:
                    continue
                want = wanted[c][j] if c in wanted else frozenset()
                seen = [i for i, d in enumerate(t.shape) if d == q]
                mine = [i for i, d in enumerate(out.shape) if d == q]
                if len(seen) != len(mine):  # a view that merges or splits them: over the tokens
                    tokens.setdefault(tid, set()).update(mine)
                    continue
                for i, m in zip(seen, mine, strict=True):
                    (keys if i in want else tokens).setdefault(tid, set()).add(m)
        outs = tuple(
            frozenset(keys.get(t.id, set()) - tokens.get(t.id, set())) if t.id is not None else frozenset()
            for t in op.outputs
        )
        if not any(outs):
            continue
        ins: _Dims = ()
        if op.kind in (OpKind.ELEMENTWISE, OpKind.MEMORY) and op.outputs:
            shape, out_keys = op.outputs[0].shape, outs[0]
            ins = tuple(
                frozenset(i for i, d in enumerate(t.shape) if d == q and i + len(shape) - len(t.shape) in out_keys)
                for t in op.inputs
            )
            wanted[p] = ins
        found[p] = (ins, outs)
    return found


def _sequence_dims(op: Attention, t: TensorSpec, query: bool) -> list[tuple[int, bool]]:
    """The query or key dimensions of an attention operand (or output, ``query``), each with whether it
    counts keys. In a prefill template queries and keys have one length: the query and outputs hold
    queries, an operand with a head-size dimension (keys, values, transposed keys) keys, and a mask
    both, queries first."""
    shape = t.shape
    if len(shape) < 2:
        return []
    seq = [i for i in range(1, len(shape)) if shape[i] > 1 and shape[i] in (op.q_len, op.kv_len)]
    keys = not query and any(shape[i] in (op.head_dim, op.dv) for i in range(1, len(shape)))
    out = []
    for n, i in enumerate(seq):
        if op.q_len != op.kv_len:
            is_q = shape[i] == op.q_len
        else:
            is_q = query or (len(seq) > 1 and n == 0) or (len(seq) == 1 and not keys)
        out.append((i, not is_q))
    return out


def _reach(start: Iterable[int], step: dict[int, list[int]], stop: set[int]) -> set[int]:
    """``start`` and what ``step`` leads to from it, not going on past the ops in ``stop`` it reaches."""
    seen = set(start)
    todo = list(seen)
    while todo:
        for j in step.get(todo.pop(), ()):
            if j not in seen:
                seen.add(j)
                if j not in stop:
                    todo.append(j)
    return seen


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
    return _reshaped(t, shape)


def _reshaped(t: TensorSpec, shape: tuple[int, ...]) -> TensorSpec:
    """``t`` at ``shape`` (as many dimensions), its layout kept (:func:`restride`)."""
    if shape == t.shape:
        return t
    return t.model_copy(update={"shape": shape, "strides": restride(t.shape, t.strides, shape)})


def restride(old: tuple[int, ...], strides: tuple[int, ...] | None, new: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of a view laid out as ``strides`` lay out ``old``, at sizes ``new``: the dimensions keep
    their order in memory; a dimension whose inner dimensions keep their sizes keeps its stride (a split
    of a model-sized last dimension), else it keeps its stride's multiple of what they span (a transposed
    view stays transposed; a half of a chunked ``[rows, 2h]`` tensor stays one). ``None`` (contiguous)
    stays ``None``, as does a layout that is neither (``None``: priced as contiguous).

    >>> restride((2, 8, 37, 64), (18944, 64, 512, 1), (3, 8, 101, 64))  # a transposed [b, seq, h, d] view
    (51712, 64, 512, 1)
    >>> restride((37, 768), (1536, 1), (101, 768))  # one half of gate_up.chunk(2, -1)
    (1536, 1)
    >>> restride((7, 37, 16), (888, 24, 1), (3, 9, 16))  # the first 16 of a [b, seq, 24] split
    (216, 24, 1)
    """
    if strides is None:
        return None
    dims = sorted((i for i in range(len(old)) if old[i] > 1 and strides[i] > 0), key=lambda i: strides[i])
    out = list(strides)
    inner_old = inner_new = 1  # elements the dimensions inside the current one span, before and after
    for i in dims:
        if inner_new != inner_old:
            gap, rest = divmod(strides[i], inner_old)
            if rest or gap < 1:
                return None
            out[i] = gap * inner_new
        inner_old, inner_new = strides[i] * old[i], out[i] * new[i]
    for i in range(len(old)):
        if old[i] <= 1 and new[i] > 1:  # a dimension of one element has no stride of its own to keep
            return None
    return tuple(out)


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


def _check_window_kv(graph: OpGraph, q_len: int, kv_len: int, window_kv: Mapping[int, int] | None) -> dict[int, int]:
    """``window_kv`` as a dict, checked: windows of ``graph``, each given at least ``q_len`` keys and at most
    what its layers read of ``kv_len`` (``min(kv_len, window - 1 + q_len)``)."""
    if not window_kv:
        return {}
    known = template_windows(graph)
    for window, keys in window_kv.items():
        if window not in known:
            raise RebatchError(
                f"window {window} is not a sliding window of this graph (its windows: {list(known)})",
                where="window_kv",
            )
        most = min(kv_len, window - 1 + q_len)
        if not q_len <= keys <= most:
            raise RebatchError(
                f"window {window} given {keys} keys, outside [{q_len}, {most}]",
                where="window_kv",
                hint="a sliding layer reads at least the new tokens and at most min(kv_len, window - 1 + q_len) keys",
            )
    return dict(window_kv)


class _Rewriter:
    """Rewrites ops of one graph for one target shape; experts calls by their layout (:mod:`.rebatch_moe`)."""

    def __init__(
        self,
        graph: OpGraph,
        batch: int,
        q_len: int,
        kv_len: int,
        tensor_ids: bool = True,
        window_kv: Mapping[int, int] | None = None,
    ) -> None:
        self.phase, b, q, kv = source_shape(graph)
        self.dims = _dim_map(self.phase, b, q, kv, batch, q_len, kv_len)
        self.tokens_old, self.tokens_new = b * q, batch * q_len
        self.batch, self.q_len, self.kv_len = batch, q_len, kv_len
        self.src = (b, q, kv)
        self.layout = _kv_layout(graph)
        self.window_kv = _check_window_kv(graph, q_len, kv_len, window_kv)
        self._key_maps: dict[int, dict[int, int]] = {}
        self.done: dict[tuple[int, _Role, int], OpBase] = {}
        self.reps = _representatives(graph)
        self.tensor_ids = tensor_ids
        self.moe = moe_layout(graph)
        self.skew = float(graph.metadata.capture.moe_skew or 0.0)
        self._routes: dict[int, tuple[list[int], dict[int, int]]] = {}
        # Token-expert pairs count rows of an experts call: a source size too (top-1 routing: the tokens).
        pairs = sorted({s.pairs for s in self.moe.sections if s.top_k > 1})
        _check_sources(graph, [*dict.fromkeys(self.dims), *pairs])

    def op(self, op: OpBase, index: int) -> OpBase | None:
        """``op`` (at ``index`` in the template) at the target shape, or ``None`` where the target drops it
        (an expert the new shape leaves idle). Ops equal but for their place (id, scope, layer, tensor
        ids), as every layer's are, are rewritten once and copied."""
        rep = self.reps[index]
        role, keys = self._context(index, op)
        if rep < 0 or role == "mask":  # a mask op: its key dimensions are its own, a handful of ops
            return self._moe_op(op, index) if index in self.moe.section_of else self._rewrite(op, role, keys, index)
        done = self.done.get((rep, role, keys))
        if done is None:
            done = self.done[(rep, role, keys)] = self._rewrite(op, role, keys)
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

    def dropped(self) -> frozenset[int]:
        """Indices of the template's ops that the target drops (the GEMMs and ops of idle experts)."""
        out = set()
        for i, j in self.moe.expert.items():
            rows, _ = self._route(self.moe.section_of[i])
            if j >= len(rows):
                out.add(i)
        return frozenset(out)

    # ------------------------------------------------------------------ keys
    def _keys(self, window: int | None) -> int:
        """Keys a layer with ``window`` reads at the target: a sliding layer's cache holds ``window - 1``
        tokens before the new ones (transformers' ``DynamicSlidingWindowLayer``), or the keys the target
        gives that window (``window_kv``: a batch's mean of its capped lengths)."""
        if window is None:
            return self.kv_len
        return self.window_kv.get(window, min(self.kv_len, window - 1 + self.q_len))

    def _context(self, index: int, op: OpBase) -> tuple[_Role, int]:
        """How the template's op at ``index`` is rewritten: its role (``tokens``; ``keys``, an op over the
        keys of a prefill; ``append``, a prefill's KV-cache append; ``mask``, a prefill's op outside the
        layers that builds a mask) and the keys its layer reads (0 where they do not matter, so that the
        token-wise ops of every layer are rewritten once)."""
        layout = self.layout
        keys = self._keys(layout.windows.get(op.layer) if op.layer is not None else layout.outside.get(index))
        if index in layout.mask:
            return "mask", keys
        if index in layout.appends:
            return "append", keys
        if index in layout.key_side:
            return "keys", keys
        return "tokens", keys if self.phase == "decode" or isinstance(op, Attention) else 0

    def _key_dims(self, keys: int) -> dict[int, int]:
        """The dimension map of an op over ``keys`` keys: a decode's (its cache sizes follow ``keys``), or a
        prefill's with the sequence length mapped to ``keys`` (memoised)."""
        hit = self._key_maps.get(keys)
        if hit is None:
            b, q, kv = self.src
            if self.phase == "decode":
                hit = _dim_map(self.phase, b, q, kv, self.batch, self.q_len, keys)
            else:
                hit = {b: self.batch, q: keys, b * q: self.batch * keys}
            self._key_maps[keys] = hit
        return hit

    def _rewrite(self, op: OpBase, role: _Role, keys: int, index: int = -1) -> OpBase:
        """``op`` (at ``index``) in its role (see :meth:`_context`): an append takes new tokens and gives keys."""
        if role == "mask":
            return self._mask_op(op, *self.layout.mask[index], keys)
        if role == "tokens":
            out = self._op(op, self._key_dims(keys) if self.phase == "decode" else None)
        elif role == "keys":
            out = self._op(op, self._key_dims(keys))
        else:
            out = self._op(op, append_keys=keys)
        return self._sliced_cache(out, keys)

    def _sliced_cache(self, op: OpBase, keys: int) -> OpBase:
        """A full sliding-window cache's append: transformers keeps the cache as the last ``window - 1`` keys
        of the previous step's ``[b, heads, keys, d]`` states (a slice, so a strided view), and appends to
        it (steady state: the previous step read as many keys as this one)."""
        window = self.layout.windows.get(op.layer) if op.layer is not None else None
        full = window is not None and keys == window - 1 + self.q_len < self.kv_len
        if not (full and isinstance(op, Memory) and op.fn == "kv_cache_write"):
            return op
        cached = keys - self.q_len
        ins = tuple(
            _replace(t, {"strides": contiguous_strides((*t.shape[:-2], keys, t.shape[-1]))})
            if len(t.shape) == 4 and t.shape[-2] == cached and cached > 1
            else t
            for t in op.inputs
        )
        return _replace(op, {"inputs": ins})

    def _op(self, op: OpBase, dims: dict[int, int] | None = None, append_keys: int | None = None) -> OpBase:
        """``op`` with ``dims`` (default: the target's) mapped; a prefill's KV-cache append given
        ``append_keys`` gives that many keys, from a cache of the keys before the new tokens."""
        if isinstance(op, Attention):
            return self._attention(op)
        dims = self.dims if dims is None else dims
        ins = tuple(_map_tensor(t, dims) for t in op.inputs)
        if append_keys is None:
            outs = tuple(_map_tensor(t, dims) for t in op.outputs)
        else:
            outs = tuple(_map_tensor(t, self._key_dims(append_keys)) for t in op.outputs)
            if append_keys > self.q_len and op.outputs:  # the template's empty cache holds the prefix now
                cache = _map_tensor(op.outputs[0], self._key_dims(append_keys - self.q_len))
                ins = tuple(_replace(t, {"shape": cache.shape, "strides": None}) if t.numel == 0 else t for t in ins)
        updates: dict[str, Any] = {"inputs": ins, "outputs": outs}
        for f in _token_fields(op):
            v = getattr(op, f)
            if v in dims:
                updates[f] = dims[v]
            elif f == "rows" and op.inputs and op.inputs[0].numel:
                # Rows that count tokens times heads (Qwen3's per-head q/k norms): as the input grows.
                old, new = op.inputs[0].numel, ins[0].numel
                if v * new % old == 0:
                    updates[f] = v * new // old
        if isinstance(op, Collective):
            updates["bytes"] = self._scaled(op.bytes, self.tokens_old, self.tokens_new)
        keep = ("flops",) if isinstance(op, Gemm) and "flops" in op.model_fields_set else ()
        if keep:
            assert isinstance(op, Gemm)
            old = math.prod(getattr(op, f) for f in _PRODUCT_FIELDS)
            updates["flops"] = self._scaled(
                op.flops, old, math.prod(updates.get(f, getattr(op, f)) for f in _PRODUCT_FIELDS)
            )
        return self._with_tensors(op, updates, keep)

    def _mask_op(self, op: OpBase, ins: _Dims, outs: _Dims, keys: int) -> OpBase:
        """An op outside the layers that builds a mask: its key dimensions (``ins``, ``outs``) take ``keys``,
        its other dimensions the target's; its token fields follow the keys where its output's last
        dimension is one (the row of an elementwise op: ``hidden``)."""
        q = self.src[1]

        def tensor(t: TensorSpec, at: frozenset[int]) -> TensorSpec:
            return _reshaped(t, tuple(keys if i in at else self.dims.get(d, d) for i, d in enumerate(t.shape)))

        new_ins = tuple(tensor(t, ins[j] if j < len(ins) else frozenset()) for j, t in enumerate(op.inputs))
        new_outs = tuple(tensor(t, outs[j]) for j, t in enumerate(op.outputs))
        last = len(op.outputs[0].shape) - 1
        dims = {**self.dims, q: keys} if last in outs[0] else self.dims
        updates: dict[str, Any] = {"inputs": new_ins, "outputs": new_outs}
        for f in _token_fields(op):
            v = getattr(op, f)
            if v in dims:
                updates[f] = dims[v]
        return self._with_tensors(op, updates)

    def _with_tensors(self, op: OpBase, updates: dict[str, Any], keep: Iterable[str] = ()) -> OpBase:
        """``op`` rebuilt with ``updates`` (which hold its new tensors); element counts follow the tensors."""
        ins, outs = updates["inputs"], updates["outputs"]
        if hasattr(op, "numel") and op.outputs:
            updates["numel"] = self._scaled(op.numel, _numel(op.outputs), _numel(outs))
        if op.kind is OpKind.REDUCTION:
            updates["numel_in"] = self._scaled(op.numel_in, _numel(op.inputs), _numel(ins))  # type: ignore[attr-defined]
            updates["numel_out"] = self._scaled(op.numel_out, _numel(op.outputs), _numel(outs))  # type: ignore[attr-defined]
        return _rebuild(op, updates, keep)

    @staticmethod
    def _scaled(value: int, old: int, new: int) -> int:
        if old == 0:
            return value
        return value * new // old

    def _attention(self, op: Attention) -> OpBase:
        window = op.window
        if window is None and op.layer is not None:
            window = self.layout.windows.get(op.layer)
        kv_len = self._keys(window)
        ins = tuple(self._attention_tensor(op, t, kv_len, query=i == 0) for i, t in enumerate(op.inputs))
        outs = tuple(self._attention_tensor(op, t, kv_len, query=True) for t in op.outputs)
        stage = Stage.DECODE if self.q_len == 1 and self.kv_len > 1 else op.stage
        upd = {
            "batch": self.batch,
            "q_len": self.q_len,
            "kv_len": kv_len,
            "inputs": ins,
            "outputs": outs,
            "stage": stage,
            # One query attends every key it is given, masked or not (the model passes no causal flag).
            "causal": op.causal and self.q_len > 1,
            "window": window,
        }
        return _rebuild(op, upd)

    def _attention_tensor(self, op: Attention, t: TensorSpec, kv_len: int, query: bool) -> TensorSpec:
        """An attention operand at the target: its leading batch (or batch x heads, the eager bmm
        layout) and its query or key length (:func:`_sequence_dims`)."""
        shape = list(t.shape)
        if len(shape) < 2:
            return t
        b, nb = op.batch, self.batch
        lead = {b: nb, b * op.heads: nb * op.heads, b * op.kv_heads: nb * op.kv_heads}
        shape[0] = lead.get(shape[0], shape[0])
        for i, key in _sequence_dims(op, t, query):
            shape[i] = kv_len if key else self.q_len
        return _reshaped(t, tuple(shape))

    # ------------------------------------------------------------------ experts calls
    def _route(self, section: int) -> tuple[list[int], dict[int, int]]:
        """Rows per routed expert (busiest first) of ``section`` at the target, and its dimension map."""
        hit = self._routes.get(section)
        if hit is not None:
            return hit
        sec = self.moe.sections[section]
        tokens = self._scaled(sec.tokens, self.tokens_old, self.tokens_new)
        rows = routed_rows(sec, tokens, self.skew)
        if sec.expert_rows and len(rows) > len(sec.expert_rows):
            need = tokens_reaching_all(sec.experts, sec.top_k, sec.layer + 1)
            raise RebatchError(
                f"the template's experts call has GEMMs for {len(sec.expert_rows)} of {sec.experts} experts, "
                f"and {tokens} tokens reach {len(rows)}",
                where="graph capture settings",
                hint=f"capture the template with at least {need} tokens (balanced routing then reaches every expert)",
            )
        hit = self._routes[section] = (rows, {**self.dims, sec.pairs: tokens * sec.top_k})
        return hit

    def _moe_op(self, op: OpBase, index: int) -> OpBase | None:
        section = self.moe.section_of[index]
        sec = self.moe.sections[section]
        rows, dims = self._route(section)
        role = self.moe.role[index]
        if role == "pairs":
            return self._op(op, dims)
        if role == "expert":
            j = self.moe.expert[index]
            n = rows[j] if j < len(rows) else 0
            if n == 0:
                return None
            ins = _expert_tensors(op.inputs, self.moe.rows_in.get(index, ()), rows)
            outs = _expert_tensors(op.outputs, self.moe.rows_out.get(index, ()), rows)
            if isinstance(op, Gemm):
                upd = {"inputs": ins, "outputs": outs, "m": n, "flops": self._scaled(op.flops, op.m, n)}
                unread = sum(t.nbytes for t in op.inputs) - op.bytes_read
                if unread > 0:  # the slice of its expert's rows an ``out=`` product writes, not reads
                    upd["bytes_read"] = sum(t.nbytes for t in ins) - self._scaled(unread, op.m, n)
                return _rebuild(op, upd, ("flops", "definition"))
            return self._with_tensors(op, {"inputs": ins, "outputs": outs})
        ins = tuple(_map_tensor(t, dims) for t in op.inputs)
        outs = tuple(_map_tensor(t, dims) for t in op.outputs)
        pairs = dims[sec.pairs]
        if role == "grouped":
            assert isinstance(op, Gemm)
            return _rebuild(op, {"inputs": ins, "outputs": outs, **_grouped_fields(op, pairs, len(rows))}, _KEEP)
        if role == "batched":
            assert isinstance(op, Gemm)
            upd = {
                "inputs": ins,
                "outputs": outs,
                "batch": self._scaled(op.batch, sec.pairs, pairs),  # one product per token-expert pair
                "flops": self._scaled(op.flops, sec.pairs, pairs),
            }
            return _rebuild(op, upd, ("flops", "definition"))
        ins = _expert_tensors(op.inputs, self.moe.rows_in.get(index, ()), rows, dims, drop_empty=True)
        return _rebuild(op, {"inputs": ins, "outputs": outs, "tokens": pairs // sec.top_k})


_KEEP = ("flops", "bytes_read", "bytes_written", "definition")


def _expert_tensors(
    ts: Sequence[TensorSpec],
    owners: Sequence[int | None],
    rows: Sequence[int],
    dims: dict[int, int] | None = None,
    drop_empty: bool = False,
) -> tuple[TensorSpec, ...]:
    """Tensors whose first dimension counts an expert's rows take its new rows (an idle expert's are
    left out with ``drop_empty``); the others follow ``dims`` (or stay, without it)."""
    out: list[TensorSpec] = []
    for pos, t in enumerate(ts):
        j = owners[pos] if pos < len(owners) else None
        if j is None:
            out.append(t if dims is None else _map_tensor(t, dims))
            continue
        n = rows[j] if j < len(rows) else 0
        if n or not drop_empty:
            out.append(_reshaped(t, (n, *t.shape[1:])))
    return tuple(out)


def _grouped_fields(op: Gemm, pairs: int, active: int) -> dict[str, Any]:
    """A grouped expert GEMM over ``pairs`` rows spread over ``active`` experts, as the capture lowers it
    (:mod:`opgraph.capture.lowering.moe`): it moves the rows and the weights of the active experts only."""
    active = max(1, active)
    old_rows = op.flops // (2 * op.n * op.k)
    fields: dict[str, Any] = {"m": pairs // active, "groups": active, "flops": 2 * pairs * op.n * op.k}
    a, w = (*op.inputs, None, None)[:2]
    if a is not None and w is not None and len(a.shape) == 2 and len(w.shape) == 3:
        offsets = sum(t.numel * t.dtype.itemsize for t in op.inputs[2:])
        out_isz = (op.outputs[0] if op.outputs else a).dtype.itemsize
        fields["bytes_read"] = int(pairs * op.k * a.dtype.itemsize + active * op.k * op.n * w.dtype.itemsize + offsets)
        fields["bytes_written"] = int(pairs * op.n * out_isz)
    else:  # not the recorded layout: scale what the capture counted
        fields["bytes_read"] = _Rewriter._scaled(op.bytes_read, old_rows, pairs)
        fields["bytes_written"] = _Rewriter._scaled(op.bytes_written, old_rows, pairs)
    return fields


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


def _part_indices(graph: OpGraph) -> list[int]:
    """Indices of the ops of a prefill graph that a mixed step runs once per attention part: attention,
    the ops over its keys and the masks an eager template builds outside the layers, each over its part's
    queries and keys (see :class:`_KvLayout`), in graph order."""
    layout = _kv_layout(graph)
    attention = {i for i, op in enumerate(graph.ops) if op.kind is OpKind.ATTENTION}
    return sorted(layout.key_side | set(layout.mask) | attention)


def _base_positions(prefill: OpGraph, base: OpGraph, tokens: int) -> list[int]:
    """Where the ops of :func:`_part_indices` of ``prefill`` sit in ``base``, ``prefill`` rebatched to one
    sequence of ``tokens``: in the same order, less the expert GEMMs that rebatch dropped."""
    dropped = sorted(_Rewriter(prefill, 1, tokens, tokens, tensor_ids=False).dropped())
    indices = _part_indices(prefill)
    positions = [i - bisect.bisect_left(dropped, i) for i in indices]
    if len(base.ops) != len(prefill.ops) - len(dropped) or any(
        base.ops[p].kind is not prefill.ops[i].kind or base.ops[p].layer != prefill.ops[i].layer
        for p, i in zip(positions, indices, strict=True)
    ):
        raise RebatchError(
            "the base graph is not a rebatch of the prefill template to the step's tokens without masks "
            "(rebatch(prefill, batch=1, q_len=tokens, masks=False))",
            where="mixed_step",
        )
    return positions


def _part_ops(
    prefill: OpGraph,
    decode: OpGraph | None,
    part: AttentionPart,
    tensor_ids: bool,
    window_kv: Mapping[int, int] | None = None,
) -> list[OpBase]:
    """The ops of :func:`_part_indices` for one part of a mixed step: ``prefill`` rebatched to ``part``;
    with ``decode``, a part of decodes whose attention is ``decode``'s (a one-token query attends
    unmasked, on the model's decode path) and whose ops over the keys are the prefill's with one query
    (the same ops, over each cache plus its new token). ``window_kv`` as for :func:`rebatch`."""
    _, q_len, kv_len = _target(prefill, part.batch, part.q_len, part.kv_len)
    rw = _Rewriter(prefill, part.batch, q_len, kv_len, tensor_ids, window_kv)
    attention: Iterator[OpBase] = iter(())
    if decode is not None:
        _, _, dkv = _target(decode, part.batch, 1, part.kv_len)
        drw = _Rewriter(decode, part.batch, 1, dkv, tensor_ids, window_kv)
        ops = (drw.op(op, i) for i, op in enumerate(decode.ops) if op.kind is OpKind.ATTENTION)
        attention = (o for o in ops if o is not None)  # attention is never dropped
    out: list[OpBase | None] = []
    for i in _part_indices(prefill):
        op = prefill.ops[i]
        out.append(next(attention, None) if decode is not None and op.kind is OpKind.ATTENTION else rw.op(op, i))
    if any(o is None for o in out) or next(attention, None) is not None:
        raise RebatchError(
            "the prefill and decode templates have different attention layers",
            where="mixed_step",
            hint="capture both templates from the same model and layer count",
        )
    return [o for o in out if o is not None]


_REPS_CACHE: dict[int, tuple[OpGraph, list[int]]] = {}


def _representatives(graph: OpGraph) -> list[int]:
    """For each op, the index of the first op equal to it but for its place; -1 for routing and the ops
    of experts calls (rewritten one by one: their per-expert rows depend on their position). Memoised
    per template."""
    return graph_memo(_REPS_CACHE, graph, _build_representatives)


def _build_representatives(graph: OpGraph) -> list[int]:
    first: dict[Any, int] = {}
    reps: list[int] = []
    in_call = moe_layout(graph).section_of
    for i, op in enumerate(graph.ops):
        if i in in_call or isinstance(op, MoeRouting):
            reps.append(-1)
            continue
        key = (
            tuple((k, v) for k, v in op.__dict__.items() if k not in _PLACE and k not in ("inputs", "outputs")),
            tuple((t.shape, t.dtype, t.strides) for t in op.inputs),  # a layout prices a layout-bound op
            tuple((t.shape, t.dtype, t.strides) for t in op.outputs),
        )
        reps.append(first.setdefault(key, i))
    return reps


def _without(template: OpGraph, ops: Sequence[OpBase | None]) -> tuple[tuple[OpBase, ...], tuple[Edge, ...]]:
    """The rewritten ``ops`` of ``template`` less the dropped ones (``None``), renumbered in order, and
    the template's edges among them: an edge into a dropped op continues to the ops after it (as an
    order edge), so every dependency through a dropped op is kept."""
    if all(o is not None for o in ops):
        return tuple(o for o in ops if o is not None), template.edges
    dropped = [t.id for t, o in zip(template.ops, ops, strict=True) if o is None]
    gone = set(dropped)
    after: dict[int, list[Edge]] = {}
    for e in template.edges:
        after.setdefault(e.src, []).append(e)
    reach: dict[int, list[int]] = {}  # dropped op -> the kept ops it leads to through dropped ops only
    for d in reversed(dropped):  # edges go forward in op order: what follows is known first
        found: list[int] = []
        for e in after.get(d, ()):
            found += reach.get(e.dst, []) if e.dst in gone else [e.dst]
        reach[d] = list(dict.fromkeys(found))
    new_id: dict[int, int] = {}
    kept: list[OpBase] = []
    for o in ops:
        if o is not None:
            new_id[o.id] = len(kept)
            kept.append(o if o.id == len(kept) else _replace(o, {"id": len(kept)}))
    edges: list[Edge] = []
    pairs = {(e.src, e.dst) for e in template.edges if e.src not in gone and e.dst not in gone}
    for e in template.edges:
        if e.src in gone:
            continue
        if e.dst not in gone:
            edges.append(_replace(e, {"src": new_id[e.src], "dst": new_id[e.dst]}))
            continue
        for w in reach.get(e.dst, ()):
            if (e.src, w) not in pairs:
                pairs.add((e.src, w))
                edges.append(Edge(src=new_id[e.src], dst=new_id[w], kind=EdgeKind.ORDER))
    return tuple(kept), tuple(edges)


def rebatch(
    graph: OpGraph,
    *,
    batch: int,
    q_len: int | None = None,
    kv_len: int | None = None,
    window_kv: Mapping[int, int] | None = None,
    like: OpGraph | None = None,
    tensor_ids: bool = True,
    masks: bool = True,
) -> OpGraph:
    """``graph`` (a captured prefill or decode) at ``batch`` sequences of ``q_len`` new tokens over ``kv_len``.

    A decode graph takes ``q_len=1`` (the default) and ``kv_len`` keys attended (cache + the new
    token); a prefill graph takes ``q_len`` new tokens and ``kv_len`` keys (default ``q_len``: no
    cached prefix; larger: a chunk over a prefix). A sliding layer reads ``min(kv_len, window - 1 +
    q_len)`` keys, or ``window_kv[window]`` where given: a batch over its mean ``kv_len`` whose
    sequences' capped lengths have a shorter mean (the windows of :func:`template_windows`, each at
    least ``q_len`` and at most that cap, else :class:`RebatchError`). Ops keep their ids, order and
    edges (a chunk over a prefix, or a prompt as long as a sliding window, gains the SDPA mask ops
    transformers builds for it, which renumber the ops after them; ``masks=False`` leaves them out, as
    :func:`mixed_step`'s token-wise base, whose parts build their own); FLOPs, bytes
    and definitions are recomputed by the op models. ``like``, a rebatch of the same
    ``graph`` at the same ``batch`` and ``q_len`` (any ``kv_len``), lends the ops that do not depend
    on ``kv_len``, so only attention and KV-cache ops are rewritten (a serving simulator walking
    kv lengths at one batch size; a prefill ``like`` holding a chunk's mask ops is rewritten in full).
    ``tensor_ids=False`` lets ops repeated across layers share the
    rewritten tensors of the first one (their ids too): costs are the same and rebatching is faster,
    but tensor ids no longer trace data flow (edges still do); for graphs that are only simulated.
    Raises :class:`RebatchError`.
    """
    phase, q_len, kv_len = _target(graph, batch, q_len, kv_len)
    rw = _Rewriter(graph, batch, q_len, kv_len, tensor_ids, window_kv)
    full: list[OpBase | None]
    dropped = rw.dropped()  # the same ops as ``like``'s: they depend on the token count only
    at = [i for i in range(len(graph.ops)) if i not in dropped]
    plan = mask_plan(graph) if phase == "prefill" and masks else None
    if like is not None:
        lc = like.metadata.capture
        same_q = lc.seq_len == q_len if phase == "prefill" else True
        if lc.batch != batch or not same_q or len(like.ops) < len(at):
            raise RebatchError(
                "`like` is not a rebatch of this graph at the same batch and q_len", where="rebatch(like=...)"
            )
        if plan is not None and len(like.ops) > len(at):  # a chunk with its mask ops: rewrite in full
            like = None
        elif len(like.ops) != len(at):
            raise RebatchError(
                "`like` is not a rebatch of this graph at the same batch and q_len", where="rebatch(like=...)"
            )
    if like is None:
        full = [rw.op(op, i) for i, op in enumerate(graph.ops)]
    else:
        dependent = _kv_layout(graph).kv_dependent
        full = [None] * len(graph.ops)
        for k, i in enumerate(at):
            if i in dependent:
                full[i] = rw.op(graph.ops[i], i)
            else:
                lent, tid = like.ops[k], graph.ops[i].id
                full[i] = lent if lent.id == tid else _replace(lent, {"id": tid})
    ops, edges = _without(graph, full)
    if plan is not None and plan.needs_mask(q_len, kv_len):
        kept = sorted(dropped)

        def position(i: int) -> int:
            return i - bisect.bisect_left(kept, i)

        attention = tuple((position(a), tuple(position(s) for s in src)) for a, src in plan.attention)
        chunk = MaskedChunk(batch, q_len, kv_len, position(plan.after), attention, plan.windows)
        ops, edges = add_prefix_masks(ops, edges, [chunk])
    cap = graph.metadata.capture.model_copy(
        update={
            "batch": batch,
            "seq_len": q_len if phase == "prefill" else None,
            "kv_len": kv_len - 1 if phase == "decode" else None,
        }
    )
    md = graph.metadata.model_copy(update={"capture": cap})
    return OpGraph.model_construct(metadata=md, ops=ops, edges=edges)  # type: ignore[arg-type]


def mixed_step(
    prefill: OpGraph,
    decode: OpGraph,
    parts: Sequence[AttentionPart],
    decode_part: AttentionPart | None,
    *,
    decode_window_kv: Mapping[int, int] | None = None,
    base: OpGraph | None = None,
    tensor_ids: bool = True,
) -> OpGraph:
    """One serving step holding prefill chunks and decodes, as one graph of the real model.

    Token-wise ops (linears, norms, activations, embedding, MoE) run once over all the step's
    tokens (the prefill template rebatched to one sequence of ``sum(chunk tokens) + decodes``
    tokens), as a serving engine batches them; each attention op of the template, and each op over
    its keys (KV-cache appends, MLA's up-projection of the latent cache, the mask ops an eager template
    builds outside the layers; an SDPA chunk's masks are added per part), becomes one op per prefill
    part (the chunk over its prefix) plus one for the decodes (``decode_part``: decodes over their
    mean kv length, which keeps the keys read and the FLOPs; the attention taken from ``decode``
    rebatched to that shape), joined with the same edges (each part's ops feed their own part's).
    ``decode_window_kv`` gives the decodes' sliding layers their mean capped keys (``window_kv`` of
    :func:`rebatch`). ``base`` is the token-wise graph when the caller has it already
    (``rebatch(prefill, batch=1, q_len=tokens, masks=False)``); ``tensor_ids`` as for :func:`rebatch`.
    """
    if not parts and decode_part is None:
        raise RebatchError("a step needs at least one prefill part or decode", where="mixed_step")
    if decode_window_kv and decode_part is None:
        raise RebatchError("decode_window_kv without decodes", where="mixed_step")
    tokens = sum(p.batch * p.q_len for p in parts) + (decode_part.batch if decode_part else 0)
    if base is None:
        base = rebatch(prefill, batch=1, q_len=tokens, tensor_ids=tensor_ids, masks=False)
    elif base.metadata.capture.seq_len != tokens or base.metadata.capture.batch != 1:
        raise RebatchError(f"base graph is not the prefill at one sequence of {tokens} tokens", where="mixed_step")
    groups = [_part_ops(prefill, None, p, tensor_ids) for p in parts]
    if decode_part is not None:
        dec = AttentionPart(decode_part.batch, 1, decode_part.kv_len)
        groups.append(_part_ops(prefill, decode, dec, tensor_ids, decode_window_kv))
    slot = {base.ops[i].id: k for k, i in enumerate(_base_positions(prefill, base, tokens))}
    new_ops: list[OpBase] = []
    new_id: dict[int, list[int]] = {}
    for op in base.ops:
        k = slot.get(op.id)
        copies = [op] if k is None else [grp[k] for grp in groups]
        new_id[op.id] = list(range(len(new_ops), len(new_ops) + len(copies)))
        new_ops += [_replace(o, {"id": len(new_ops) + n}) for n, o in enumerate(copies)]
    edges: list[Edge] = []
    for e in base.edges:
        srcs, dsts = new_id[e.src], new_id[e.dst]
        if len(srcs) > 1 and len(dsts) > 1:  # both run per part: each part's ops feed its own
            pairs: Iterable[tuple[int, int]] = zip(srcs, dsts, strict=True)
        else:
            pairs = ((s, d) for s in srcs for d in dsts)
        edges += [_replace(e, {"src": s, "dst": d}) for s, d in pairs]
    masked = _part_masks(prefill, base, tokens, parts, new_id)
    ops, all_edges = add_prefix_masks(new_ops, edges, masked)
    return OpGraph.model_construct(metadata=base.metadata, ops=ops, edges=all_edges)  # type: ignore[arg-type]


def _part_masks(
    prefill: OpGraph, base: OpGraph, tokens: int, parts: Sequence[AttentionPart], new_id: dict[int, list[int]]
) -> list[MaskedChunk]:
    """The prefill parts of a mixed step that are chunks over a prefix, each with its mask (as
    :func:`rebatch` gives one chunk: :mod:`opgraph.transforms.rebatch_mask`), by op id in the step."""
    plan = mask_plan(prefill)
    if plan is None or not any(plan.needs_mask(p.q_len, p.kv_len) for p in parts):
        return []
    dropped = sorted(_Rewriter(prefill, 1, tokens, tokens, tensor_ids=False).dropped())

    def ids(i: int) -> list[int]:
        return new_id[base.ops[i - bisect.bisect_left(dropped, i)].id]

    return [
        MaskedChunk(
            p.batch,
            p.q_len,
            p.kv_len,
            ids(plan.after)[0],
            tuple((ids(a)[k], tuple(ids(s)[k] for s in src)) for a, src in plan.attention),
            plan.windows,
        )
        for k, p in enumerate(parts)
        if plan.needs_mask(p.q_len, p.kv_len)
    ]
