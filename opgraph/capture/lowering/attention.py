"""``attention``: SDPA, flash/efficient/cudnn kernels and the eager ``matmul-softmax-matmul`` pattern
become one :class:`~opgraph.ir.Attention` each, with GQA/MHA/MQA/MLA and the sliding window found.

The key/value operands are followed back to the KV-cache write (a ``cat`` or ``index_copy`` into the
cache, claimed as ``Memory(kv_cache_write)``) and to ``repeat_kv`` copies (``Memory(repeat_kv)``),
which also reveal the number of KV heads when the model expanded them before attention. A one-token
GQA decode that transformers ran on the key/value heads, its query groups packed into the query-length
dimension, is recorded with the model's heads and one query per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from opgraph.capture.lowering.base import FREE, Lowering, numel
from opgraph.capture.lowering.memory import memory_fn
from opgraph.capture.recorder import Event, TRef, sdpa_math_path
from opgraph.ir.dtypes import DType
from opgraph.ir.ops import AttentionVariant, EagerPass, OpKind, sdpa_math_passes

SDPA_FNS = frozenset(
    {
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_attention_math",
        "_flash_attention_forward",
        "_efficient_attention_forward",
        "flash_attn_func",
        "flash_attn_varlen_func",
    }
)
_KV_WRITE_FNS = frozenset({"cat", "index_copy", "index_copy_", "index_put", "index_put_", "copy_", "slice_scatter"})
_ALLOC_FNS = frozenset({"empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided"})
"""Allocations that leave the memory uninitialised (no kernel)."""
_PASS_THROUGH = frozenset({"_to_copy", "clone", "contiguous", "copy"})
_SCORE_CHAIN = frozenset(
    {"add", "mul", "div", "sub", "_to_copy", "masked_fill", "where", "tanh", "clone", "copy", "maximum", "cat"}
)


_SOFTMAX_FNS = frozenset({"_softmax", "softmax", "_safe_softmax"})
_ROW_MAX_FNS = frozenset({"amax", "max", "logsumexp"})


def _math_path(ev: Event) -> bool:
    """Whether CUDA runs this SDPA call on its math path (:func:`~opgraph.capture.recorder.sdpa_math_path`)."""
    gqa = ev.kwargs.get("enable_gqa", ev.args[7] if len(ev.args) > 7 else False)
    return sdpa_math_path(ev.inputs[0].shape, ev.inputs[1].shape, ev.inputs[2].shape, bool(gqa))


def _ir_dtype(ref: TRef) -> DType | None:
    try:
        return DType(ref.dtype)
    except ValueError:  # a type the IR does not name
        return None


def _half_to_float(lw: Lowering, e: Event) -> bool:
    """A float16-to-float32 cast that only a softmax reads: ``softmax(x, dtype=torch.float32)`` of half
    scores (transformers' eager attention). On CUDA ATen runs that as one softmax kernel that reads half
    (``_softmax(..., half_to_float=True)``); on meta and the CPU it records the cast apart."""
    if e.fn != "_to_copy" or len(e.inputs) != 1 or e.inputs[0].dtype != "fp16" or e.outputs[0].dtype != "fp32":
        return False
    readers = [lw.events[j] for j in lw.consumers.get(e.outputs[0].tid, ())]
    return bool(readers) and all(r.fn in _SOFTMAX_FNS for r in readers)


def _per_score_and_row(refs: list[TRef], rows: int, kv_len: int) -> tuple[float, float]:
    """Bytes of ``refs`` as (per score, per query row): a tensor of ``rows`` rows of ``X`` columns holds a
    score per key and ``X - kv_len`` more per row (a sinks column; ``X`` alone for a row statistic);
    any other (a mask broadcast over the heads) is a fixed share of the scores."""
    per_score = per_row = 0.0
    for r in refs:
        dtype = _ir_dtype(r)
        size, cols = (dtype.itemsize if dtype else 1.0), (r.shape[-1] if r.shape else 1)
        if numel(r) == rows * cols and cols >= kv_len:
            per_score, per_row = per_score + size, per_row + size * (cols - kv_len)
        elif numel(r) == rows * cols:
            per_row += size * cols
        else:
            per_score += size * numel(r) / (rows * kv_len)
    return per_score, per_row


def _eager_passes(lw: Lowering, members: list[int], score_mm: Event, out_mm: Event) -> tuple[EagerPass, ...]:
    """The kernels eager attention runs over its scores between the two matmuls (views launch none), in
    order, with their bytes per score and per query row (:class:`~opgraph.ir.EagerPass`)."""
    shape = score_mm.outputs[0].shape
    kv_len = shape[-1] if shape else 1
    rows = numel(score_mm.outputs[0]) // max(kv_len, 1)
    passes: list[EagerPass] = []
    addend = score_mm.inputs[0] if score_mm.fn == "baddbmm" and len(score_mm.inputs) == 3 else None
    if addend is not None and score_mm.kwargs.get("beta", 1) != 0 and numel(addend) < numel(score_mm.outputs[0]):
        # baddbmm(alibi, q, k^T) copies its broadcast addend into the scores, then accumulates onto them
        read, read_row = _per_score_and_row([addend], rows, kv_len)
        out = _ir_dtype(score_mm.outputs[0]) or DType.bf16
        passes.append(
            EagerPass(
                kind=OpKind.MEMORY,
                fn="addend",
                read=read,
                read_row=read_row,
                written=out.itemsize,
                dtype=_ir_dtype(addend) or out,
                broadcast=True,
                addend=True,
            )
        )
    upcast: float | None = None
    for i in sorted(members):
        e = lw.events[i]
        if i in (score_mm.index, out_mm.index) or e.alias or not e.outputs or not rows:
            continue
        if _half_to_float(lw, e):
            upcast = _per_score_and_row(list(e.inputs), rows, kv_len)[0]
            continue
        fn, moved = e.fn, memory_fn(e)
        if fn in _SOFTMAX_FNS:
            kind = OpKind.SOFTMAX
        elif fn in _ROW_MAX_FNS:
            kind = OpKind.REDUCTION
        elif moved is not None:
            kind, fn = OpKind.MEMORY, moved  # named as the memory lowering names it (cast, copy, cat)
        else:
            kind = OpKind.ELEMENTWISE
        read, read_row = _per_score_and_row(list(e.inputs), rows, kv_len)
        if kind is OpKind.SOFTMAX and upcast is not None:
            read, upcast = upcast, None  # the half scores, read by the softmax itself
        written, written_row = _per_score_and_row(list(e.outputs), rows, kv_len)
        widths = [r.shape[-1] for r in (*e.inputs, *e.outputs) if r.shape and numel(r) == rows * r.shape[-1]]
        passes.append(
            EagerPass(
                kind=kind,
                fn=fn,
                read=read,
                written=written,
                read_row=read_row,
                written_row=written_row,
                # a cast (as a graph's Memory op) carries the dtype it reads; others the one they compute in
                dtype=_ir_dtype(e.inputs[0] if kind is OpKind.MEMORY and e.inputs else e.outputs[0]) or DType.bf16,
                extra_cols=max((w - kv_len for w in widths if w >= kv_len), default=0),
                broadcast=kind in (OpKind.ELEMENTWISE, OpKind.MEMORY)
                and any(r.dtype != "bool" and 1 < numel(r) < numel(e.outputs[0]) for r in e.inputs),
            )
        )
    return tuple(passes)


def _kv_source(lw: Lowering, tid: int) -> int | None:
    """Follow a key/value operand back through repeat_kv copies to the cache write.

    Returns the kv heads seen before a repeat_kv copy, or None. Claims the repeat_kv copies and the
    cache write it passes.
    """
    kv_heads: int | None = None
    for _ in range(4):
        ev = lw.producer_of(tid)
        if ev is None or not lw.free(ev.index):
            break
        if ev.fn in ("clone", "_unsafe_view", "expand", "_to_copy", "contiguous") and ev.inputs:
            src = ev.inputs[0]
            shape, strides = src.shape, src.strides
            if strides is not None and len(shape) == 5 and strides[2] == 0:
                kv_heads = shape[1]
                lw.claim([ev.index], OpKind.MEMORY, {"fn": "repeat_kv", "numel": numel(ev.outputs[0])})
                tid = src.tid
                continue
            break
        if ev.fn in _KV_WRITE_FNS and not _assembles(lw, ev):
            out = ev.outputs[0]
            lw.claim([ev.index], OpKind.MEMORY, {"fn": "kv_cache_write", "numel": numel(out)})
            break
        break
    return kv_heads


def _assembles(lw: Lowering, ev: Event) -> bool:
    """Whether ``ev`` writes a piece of a tensor the forward allocated uninitialised and fills copy by copy
    (DeepSeek-V3's MLA keys: ``new_empty``, then a ``copy_`` into each slice): a new tensor being put
    together, not a KV cache, which outlives the forward and is appended to, never allocated empty."""
    for _ in range(8):
        if not ev.inputs:
            return False
        src = lw.producer_of(ev.inputs[0].tid)
        if src is None:
            return False
        if src.fn in _ALLOC_FNS:
            return True
        if not (src.mutates and src.fn in _KV_WRITE_FNS):
            return False
        ev = src
    return False


def _unpacked_query(lw: Lowering, ev: Event) -> TRef | None:
    """The query of a one-token GQA decode before transformers packed its head groups, or None.

    transformers 5.18 on (``integrations/sdpa_attention.py``, ``pack_gqa``) runs a one-token decode
    that has a mask on the key/value heads, without ``repeat_kv``: it views the query
    ``(b, heads, 1, d)`` as ``(b, kv_heads, heads // kv_heads, d)``, so SDPA sees each group's queries
    as a query length. Found by that view, which keeps the tensor id: the query it returns is the
    same tensor in the model's shape.
    """
    q, k = ev.inputs[0], ev.inputs[1]
    b, kvh, group, d = q.shape
    if group < 2 or k.shape[1] != kvh:
        return None
    for i in reversed(lw.consumers.get(q.tid, ())):
        view = lw.events[i]
        if i >= ev.index or not view.alias or not view.inputs or q not in view.outputs:
            continue
        src = view.inputs[0]
        if src.tid == q.tid and src.shape == (b, kvh * group, 1, d):
            return src
        return None
    return None


def _heads_from_producer(lw: Lowering, ref: TRef) -> tuple[int, int] | None:
    """(batch, heads) of a 4-D tensor behind a 3-D bmm operand."""
    ev = lw.producer_of(ref.tid)
    if ev is None:
        return None
    for r in ev.outputs:
        if r.tid == ref.tid and len(r.shape) == 4:
            return r.shape[0], r.shape[1]
    return None


def _variant(lw: Lowering, heads: int, kv_heads: int) -> AttentionVariant:
    if lw.hints.mla:
        return AttentionVariant.MLA
    if kv_heads == heads:
        return AttentionVariant.MHA
    if kv_heads == 1:
        return AttentionVariant.MQA
    return AttentionVariant.GQA


def _fields(
    lw: Lowering,
    batch: int,
    heads: int,
    kv_heads: int,
    q_len: int,
    kv_len: int,
    d: int,
    dv: int,
    causal: bool,
    call: int,
) -> dict[str, Any] | None:
    if heads % kv_heads or q_len > kv_len:
        return None
    window = lw.layer_window(call)
    f: dict[str, Any] = {
        "batch": batch,
        "q_len": q_len,
        "kv_len": kv_len,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": d,
        "causal": causal,
        "variant": _variant(lw, heads, kv_heads),
    }
    if dv != d:
        f["head_dim_v"] = dv
    if window is not None:  # the layer's window, even where it masks nothing yet: rebatching needs it
        f["window"] = window
    return f


@dataclass(frozen=True)
class LowerAttention:
    """Recognise fused and eager attention."""

    name: ClassVar[str] = "attention"
    eager: bool = True
    """Also match the eager matmul-softmax-matmul pattern."""

    def run(self, lw: Lowering) -> None:
        for ev in lw.free_events():
            if ev.fn in SDPA_FNS and len(ev.inputs) >= 3:
                self._fused(lw, ev)
        if self.eager:
            for ev in lw.free_events():
                if ev.fn in ("_softmax", "softmax", "_safe_softmax"):
                    self._eager(lw, ev)

    def _fused(self, lw: Lowering, ev: Event) -> None:
        q, k, v = ev.inputs[0], ev.inputs[1], ev.inputs[2]
        if len(q.shape) != 4 or len(k.shape) != 4:
            return
        flash_layout = ev.fn in ("_flash_attention_forward", "flash_attn_func")
        if flash_layout:  # (b, s, h, d)
            b, s, h, d = q.shape
            kv_len, kvh = k.shape[1], k.shape[2]
        else:  # (b, h, s, d)
            b, h, s, d = q.shape
            kvh, kv_len = k.shape[1], k.shape[2]
        dv = v.shape[-1]
        query = None if flash_layout else _unpacked_query(lw, ev)
        if query is not None:  # a packed one-token decode: the model's heads, one query each
            h, s = query.shape[1], 1
        kv_heads_seen = _kv_source(lw, k.tid)
        _kv_source(lw, v.tid)
        if kv_heads_seen is not None:
            kvh = kv_heads_seen
        causal_kw = ev.kwargs.get("is_causal")
        if causal_kw is None and len(ev.args) > 5:
            causal_kw = ev.args[5]
        has_mask = len(ev.inputs) > 3
        # A mask given to SDPA on a decoder is the causal (or windowed) mask; a lone query sees all keys.
        causal = bool(causal_kw) or (has_mask and s > 1)
        f = _fields(lw, b, h, kvh, s, kv_len, d, dv, causal, ev.call)
        if f is None:
            return
        if not flash_layout and _math_path(ev):
            mask = _ir_dtype(ev.inputs[3]) if has_mask else None
            half = q.dtype in ("bf16", "fp16")
            passes = sdpa_math_passes(mask_bytes=mask.itemsize if mask else 0.0, heads=h, half=half)
            f |= {"math": True, "eager": passes}
        g = lw.claim([ev.index, *self._layout_copy(lw, ev)], OpKind.ATTENTION, f, call=ev.call)
        out = ev.outputs[0]
        if query is not None:
            g.input_views = {q.tid: query}
            out = TRef(out.tid, (b, h, s, dv), out.dtype, None)  # what the model reshapes it back to
        g.outputs = [out]

    @staticmethod
    def _layout_copy(lw: Lowering, ev: Event) -> list[int]:
        """The ``transpose(1, 2).contiguous()`` copy right after attention, if any.

        Whether it runs depends on the backend's output layout (flash kernels write (b, s, h, d) and
        need none); it is made part of the attention op so graphs agree across devices.
        """
        cons = lw.consumers_of(ev.outputs[0].tid)
        if len(cons) == 1 and cons[0].fn == "clone" and lw.free(cons[0].index):
            return [cons[0].index]
        return []

    def _eager(self, lw: Lowering, sm: Event) -> None:
        # Back from the softmax input to the scores matmul.
        chain: list[int] = [sm.index]
        cur = sm.inputs[0].tid
        score_mm: Event | None = None
        for _ in range(8):
            p = lw.producer_of(cur)
            if p is None or not lw.free(p.index):
                return
            if p.fn in ("bmm", "matmul", "baddbmm"):
                score_mm = p
                break
            if p.fn not in _SCORE_CHAIN:
                return
            chain.append(p.index)
            cur = p.inputs[0].tid
        if score_mm is None:
            return
        # Forward from the softmax output to the value matmul.
        out_mm: Event | None = None
        cur = sm.outputs[0].tid
        fwd: list[int] = []
        for _ in range(4):
            cons = [c for c in lw.consumers_of(cur) if lw.free(c.index)]
            if len(cons) != 1:
                return
            c = cons[0]
            if c.fn in ("bmm", "matmul"):
                out_mm = c
                break
            if c.fn not in ("_to_copy", "native_dropout", "dropout", "clone", "mul"):
                return
            fwd.append(c.index)
            cur = c.outputs[0].tid
        if out_mm is None:
            return
        qa, ka = score_mm.inputs[-2], score_mm.inputs[-1]
        va = out_mm.inputs[1]
        bh, s, d = qa.shape[-3], qa.shape[-2], qa.shape[-1]
        kv_len = ka.shape[-1]
        dv = va.shape[-1]
        bh_shape = _heads_from_producer(lw, qa)
        if bh_shape is not None:
            b, h = bh_shape
        elif lw.hints.num_heads and bh % lw.hints.num_heads == 0:
            b, h = bh // lw.hints.num_heads, lw.hints.num_heads
        else:
            b, h = 1, bh
        kvh_seen = _kv_source(lw, ka.tid)
        _kv_source(lw, va.tid)
        kvh = kvh_seen or h
        scores = [lw.events[i] for i in chain]
        masked = any(e.fn in ("add", "masked_fill", "where") and len(e.inputs) > 1 for e in scores)
        f = _fields(lw, b, h, kvh, s, kv_len, d, dv, masked and s > 1, sm.call)
        if f is None:
            return
        members = [score_mm.index, *chain, *fwd, out_mm.index]
        # Side branches inside the pattern (gpt-oss subtracts the row max over scores and sinks).
        inside = set(members)
        produced = {r.tid for i in inside for r in lw.events[i].outputs}
        for i in range(score_mm.index + 1, out_mm.index):
            e = lw.events[i]
            if i in inside or not lw.free(i) or not e.outputs:
                continue
            if any(r.tid in produced for r in e.inputs) and all(
                c in inside for r in e.outputs for c in lw.consumers.get(r.tid, ()) if lw.owner[c] != FREE
            ):
                members.append(i)
                inside.add(i)
                produced.update(r.tid for r in e.outputs)
        f["eager"] = _eager_passes(lw, members, score_mm, out_mm)
        lw.claim(members, OpKind.ATTENTION, f, target="eager_attention", call=out_mm.call)
