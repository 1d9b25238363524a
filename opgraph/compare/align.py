"""Aligning a graph's ops with a measured trace's kernels inside one (step, layer) bucket.

A trace recorded with ``record_shapes`` names the aten call that launched every kernel, with its input
shapes. A graph op lowered from one aten call is aligned with the trace's call of that name and input
shapes, in call order; a fused graph op (an RMSNorm module, RoPE, SwiGLU) takes every call it was fused
from: the one it is named after when it has one (SwiGLU's ``aten::silu``, found from where its first
input is produced, since eager runs it before the up projection that precedes it in the graph), and
the unaligned kernels between it and the next aligned op (SwiGLU's gating ``aten::mul``; RoPE's mul,
neg, cat, mul and add).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from opgraph.ir.ops import OpBase
from opgraph.trace.events import GpuEvent, HostEvent
from opgraph.trace.importer import OP_KIND_OF_TYPE

KIND_OF_TYPE = {
    **{ktype: kind.value for ktype, kind in OP_KIND_OF_TYPE.items()},
    "moe": "moe",  # kept apart, as the graph side keeps its expert GEMMs and routing (measured._family)
    "quantization": "elementwise",
}
"""Kernel type of a measured kernel -> op kind of the graph (coarser where the graph has no such kind)."""
SEARCH = 48
"""Kernels searched ahead for an op's call of the same input shapes."""
NEAR = 6
"""Kernels searched ahead for a call of the same name whose shapes differ from the op's, in a bucket whose
trace ran other shapes than the graph's, unless those shapes are another op's of the bucket."""

Shapes = tuple[tuple[int, ...], ...]


@dataclass
class Bucket:
    """Graph ops and measured kernels of one (step, layer) of one rank; ``layer`` None is outside layers."""

    step: int
    layer: int | None
    stage: str
    ops: list[OpBase] = field(default_factory=list)
    kernels: list[GpuEvent] = field(default_factory=list)


def kind_of(g: GpuEvent) -> str:
    """The graph op kind of a measured device event."""
    if g.kind != "kernel":
        return "memory"
    return KIND_OF_TYPE.get(g.ktype.value, "other")


def aten_name(op: OpBase) -> str | None:
    """``mm`` for an op whose target is ``aten.mm.default``; None for a module or a named pattern (``rope``)."""
    t = op.target
    if not t.startswith("aten."):
        return None
    return t.split(".")[1]


def _op_name(h: HostEvent) -> str:
    return h.name.rsplit("::", 1)[-1]


def _is_shape(d: object) -> bool:
    return isinstance(d, (list, tuple)) and bool(d) and all(type(x) is int for x in d) and 0 not in d


def dims_key(dims: object) -> Shapes | None:
    """Non-empty tensor shapes of a trace call's inputs, in order; a tensor list (``aten::cat``'s
    ``[[[1,8,512,64],[1,8,1,64]],[]]``) gives each of its tensors; empty tensors and scalars are left out.

    >>> dims_key([[[1, 8, 512, 64], [1, 8, 1, 64]], []])
    ((1, 8, 512, 64), (1, 8, 1, 64))
    >>> dims_key([[[0], [1, 8, 4, 64]], [], [2, 3]])
    ((1, 8, 4, 64), (2, 3))
    """
    if not isinstance(dims, (list, tuple)):
        return None
    out: list[tuple[int, ...]] = []
    for d in dims:
        if _is_shape(d):
            out.append(tuple(d))
        elif isinstance(d, (list, tuple)) and d and all(isinstance(x, (list, tuple)) for x in d):
            out.extend(tuple(x) for x in d if _is_shape(x))
    return tuple(out)


def graph_key(op: OpBase) -> Shapes:
    """Non-empty tensor shapes of a graph op's inputs, in order (as :func:`dims_key` reads a trace call)."""
    return tuple(tuple(t.shape) for t in op.inputs if t.shape and 0 not in t.shape)


def chain(g: GpuEvent) -> list[HostEvent]:
    """The CPU ops around a kernel's launch, innermost first."""
    out = []
    h = g.launch_host
    while h is not None:
        out.append(h)
        h = h.parent
    return out


class _Aligner:
    """One bucket's alignment: kernels taken so far, calls used, and each op's kernels."""

    def __init__(self, bucket: Bucket) -> None:
        self.ops = bucket.ops
        self.kernels = bucket.kernels
        self.chains = [chain(g) for g in self.kernels]
        self.consumed = [False] * len(self.kernels)
        self.used: set[int] = set()
        self.owner: dict[int, list[int]] = {}
        self.pos = 0
        # shapes of the bucket's single-call ops, by aten name: a call of those shapes is theirs
        self.claimed: dict[str, set[Shapes]] = {}
        for op in self.ops:
            name = aten_name(op)
            if name is not None and op.call is not None:
                self.claimed.setdefault(name, set()).add(graph_key(op))
        self.producer: dict[int, int] = {}
        for op in self.ops:
            for t in op.outputs:
                if t.id is not None:
                    self.producer[t.id] = op.id
        # When most single-call ops find a call of their shapes, the trace ran the graph's shapes: a call of
        # the same name and other shapes is another computation (RoPE's rotate_half cat is no KV-cache cat),
        # so no op takes a call by name alone. Otherwise (a trace of other shapes) near calls go by name.
        calls = {(_op_name(h), dims_key(h.input_dims)) for ch in self.chains for h in ch}
        single = [(name, graph_key(op)) for op in self.ops if op.call is not None and (name := aten_name(op))]
        self.by_name = not single or sum(1 for k in single if k in calls) < 0.5 * len(single)

    def find(self, name: str, start: int, key: Shapes | None, *, prefix: bool = False) -> HostEvent | None:
        """The first unused call ``name`` from kernel ``start`` on: of input shapes ``key`` (or, with
        ``prefix``, the first of them: a fused op's first call reads its first inputs), or with ``key``
        None a near call whose shapes no other op of the bucket has."""
        reach = SEARCH if key else NEAR  # no input tensors to compare: only a near call of that name
        others = self.claimed.get(name, set())
        for k in range(start, min(start + reach, len(self.kernels))):
            if self.consumed[k]:
                continue
            for h in self.chains[k]:
                if id(h) in self.used or _op_name(h) != name:
                    continue
                got = dims_key(h.input_dims)
                if key is None:
                    if got not in others:
                        return h
                elif got == key or (prefix and got and key[: len(got)] == got):
                    return h
        return None

    def start_of(self, op: OpBase) -> int:
        """Where to look for a fused op's first call: after the kernels of its first input's producer
        when that op is aligned (it may run before the graph's previous op), else where the search is."""
        src = self.producer.get(op.inputs[0].id) if op.inputs and op.inputs[0].id is not None else None
        if src is not None and self.owner.get(src):
            return min(self.pos, self.owner[src][-1] + 1)
        return self.pos

    def by_call(self) -> list[tuple[int, int, int]]:
        """Align every op named after an aten call; (graph order, first kernel, last kernel) of each."""
        matched_at: list[tuple[int, int, int]] = []
        for order, op in enumerate(self.ops):
            name = aten_name(op)
            if name is None:
                continue
            fused = op.call is None
            start = self.start_of(op) if fused else self.pos
            key = graph_key(op)
            call = self.find(name, start, key, prefix=fused)
            if call is None and self.by_name:
                call = self.find(name, start, None)
            if call is None:
                continue
            self.used.add(id(call))
            idx = [
                k
                for k in range(start, len(self.kernels))
                if not self.consumed[k] and any(h is call for h in self.chains[k])
            ]
            if not idx:
                continue
            for k in idx:
                self.consumed[k] = True
            self.owner[op.id] = idx
            matched_at.append((order, idx[0], idx[-1]))
            self.pos = max(self.pos, idx[0])
        return matched_at

    def between(self, matched_at: list[tuple[int, int, int]]) -> None:
        """Fused ops (modules, named patterns, ops fused from several calls) take the unaligned kernels
        between their aligned neighbours; a fused op aligned by its first call takes those after it."""
        ops, kernels = self.ops, self.kernels
        bounds = [(-1, -1, -1), *matched_at, (len(ops), len(kernels), len(kernels))]
        for (o1, _, last1), (o2, first2, _) in itertools.pairwise(bounds):
            left = [k for k in range(last1 + 1, first2) if not self.consumed[k]]
            if not left:
                continue
            between = [op for op in ops[o1 + 1 : o2] if op.id not in self.owner]
            takers = [op for op in between if aten_name(op) is None or op.call is None]
            if o1 >= 0 and ops[o1].call is None:
                takers = [ops[o1], *takers]
            if not takers:
                continue
            for op, part in zip(takers, segment(takers, [kernels[k] for k in left]), strict=True):
                idx = [left[i] for i in part]
                if idx:
                    self.owner.setdefault(op.id, []).extend(idx)
                    for k in idx:
                        self.consumed[k] = True


def align_ops(bucket: Bucket) -> tuple[dict[int, list[GpuEvent]], set[int]]:
    """Measured device events of each graph op of a bucket (op id -> events), by call order, name and shapes,
    and the ids of the ops aligned with a call of their own (the others took kernels between neighbours)."""
    a = _Aligner(bucket)
    matched_at = a.by_call()
    called = set(a.owner)
    a.between(matched_at)
    return {op_id: [a.kernels[k] for k in sorted(idx)] for op_id, idx in a.owner.items()}, called


def hand_over(buckets: Sequence[Bucket], owners: dict[int, list[GpuEvent]]) -> None:
    """Give the kernels that end a bucket unowned to the fused op that starts the next bucket of the step,
    when that op took the next bucket's first kernel: the trace's layer boundary fell inside the op (an
    RMSNorm's cast to fp32 before the ``pow`` that marks a layer's start). ``buckets`` in time order."""
    owner_of = {id(g): op_id for op_id, ks in owners.items() for g in ks}
    fused = {op.id for b in buckets for op in b.ops if op.call is None}
    for b1, b2 in itertools.pairwise(buckets):
        if b1.step != b2.step or not b1.kernels or not b2.kernels or not b2.ops:
            continue
        if b1.kernels[-1].ts > b2.kernels[0].ts:
            continue  # b1 does not end where b2 begins (the outside-layers bucket spans the pass)
        first = owner_of.get(id(b2.kernels[0]))
        if first is None or first != b2.ops[0].id or first not in fused:
            continue
        tail: list[GpuEvent] = []
        for g in reversed(b1.kernels):
            if id(g) in owner_of:
                break
            tail.append(g)
        if tail and len(tail) < len(b1.kernels):
            owners[first] = [*reversed(tail), *owners[first]]
            for g in tail:
                owner_of[id(g)] = first


def work_kind(g: GpuEvent) -> str:
    """What a kernel computes, for handing it to one of several fused ops: GEMMs by their launching op."""
    if g.launched_by_matmul:
        return "gemm"
    kind = kind_of(g)
    return "moe_routing" if kind == "moe" else kind


def _first_shape(g: GpuEvent) -> set[tuple[int, ...]]:
    """The first input shape of each CPU op around a kernel's launch."""
    out = set()
    for h in chain(g):
        key = dims_key(h.input_dims)
        if key:
            out.add(key[0])
    return out


def _by_first_input(takers: Sequence[OpBase], kernels: Sequence[GpuEvent]) -> list[list[int]] | None:
    """Cut kernels among fused ops where each op's first call starts: the first kernel, from the previous
    cut on, launched by a call that reads the op's first input (RoPE of the queries, then of the keys);
    None when some op's start is not found or the ops' first inputs do not tell them apart."""
    firsts = [tuple(op.inputs[0].shape) if op.inputs else None for op in takers]
    if any(f is None for f in firsts) or len(set(firsts)) < len(firsts):
        return None
    shapes = [_first_shape(g) for g in kernels]
    cuts = [0]
    for f in firsts[1:]:
        at = next((i for i in range(cuts[-1] + 1, len(kernels)) if f in shapes[i]), None)
        if at is None:
            return None
        cuts.append(at)
    if firsts[0] not in shapes[0]:
        return None
    cuts.append(len(kernels))
    return [list(range(a, b)) for a, b in itertools.pairwise(cuts)]


def _signature(g: GpuEvent) -> tuple[str, Shapes | None]:
    h = g.launch_host
    return ("", None) if h is None else (h.name, dims_key(h.input_dims))


def _by_period(takers: Sequence[OpBase], kernels: Sequence[GpuEvent]) -> list[list[int]] | None:
    """Cut kernels among fused ops that run the same calls one after the other (RoPE of the queries, then of
    the keys, with as many heads): the shortest run of calls that repeats once per op from the first kernel;
    kernels after the last repeat stay with the last op. None when no run repeats so."""
    n = len(takers)
    sigs = [_signature(g) for g in kernels]
    for period in range(1, len(kernels) // n + 1):
        if all(sigs[i] == sigs[i % period] for i in range(n * period)):
            parts = [list(range(j * period, (j + 1) * period)) for j in range(n)]
            parts[-1] += list(range(n * period, len(kernels)))
            return parts
    return None


def segment(takers: Sequence[OpBase], kernels: Sequence[GpuEvent]) -> list[list[int]]:
    """Split kernels (in time order) among fused ops (in graph order) without reordering, on GEMMs: a GEMM
    kernel (by its launching op) moves on to the next GEMM op, the first other kernel after it to the op
    after that (MoE: router, expert GEMM, activation, expert GEMM, combine). Without GEMMs to go by, each
    op starts at the first kernel whose call reads its first input (RoPE of q, then of k), or where the
    calls of the one before repeat (q and k of as many heads); failing both the kernels are shared out
    evenly."""
    parts: list[list[int]] = [[] for _ in takers]
    gemm = [op.kind.value == "gemm" for op in takers]
    t = 0
    guided = False
    for i, g in enumerate(kernels):
        is_gemm = work_kind(g) == "gemm"
        if is_gemm and not gemm[t]:
            nxt = next((j for j in range(t + 1, len(takers)) if gemm[j]), None)
            if nxt is not None:
                t, guided = nxt, True
        elif not is_gemm and gemm[t] and t + 1 < len(takers) and not gemm[t + 1]:
            t += 1
        parts[t].append(i)
    if not guided and len(takers) > 1:
        by_input = _by_first_input(takers, kernels) or _by_period(takers, kernels)
        if by_input is not None:
            return by_input
        share = max(1, math.ceil(len(kernels) / len(takers)))
        parts = [list(range(i * share, min((i + 1) * share, len(kernels)))) for i in range(len(takers))]
    return parts
