"""Attributing a measured trace's kernels to graph ops by the trace's module ranges and CPU aten ops.

A trace profiled with a ``record_function`` range around every module call (``PREFIX:model.layers.0.mlp``,
as ``benchmarks/gpu/heldout.py`` records them) says which module launched each kernel, even without
input shapes. Each kernel is given to a *unit*: the outermost CPU op on its launch path named like one of
the graph's single-call ops (``aten::mm`` inside ``aten::linear``), else its top-level CPU op. Units go to
a bucket, ``(step, scope)``: the deepest scope of the graph's ops that is the unit's module path or
encloses it (a SiLU module's call goes to its MLP's scope, where the graph keeps the fused activation).
Within a bucket, the named units are matched to the graph's single-call ops of that scope by name, as
sequences (``difflib``: a trace that adds or lacks a call here and there still lines up); the kernels of
the other units go to the bucket's fused ops (RMSNorm modules, RoPE, SwiGLU) between the matched
neighbours, split among several as :func:`opgraph.compare.align.segment` splits them.
"""

from __future__ import annotations

import bisect
import difflib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from opgraph.compare.align import Bucket, aten_name, chain, kind_of, segment
from opgraph.ir.ops import OpBase, OpCategory
from opgraph.ir.timeline import SpanCategory
from opgraph.trace.events import GpuEvent, HostEvent, TraceData

ModuleRange = tuple[float, float, str]
"""(start, end, module path) of a module range on one host thread."""


def range_path(name: str) -> str:
    """The module path an annotation names: what follows its last ``:`` (``heldout_mod:model.norm``).

    >>> range_path("heldout_mod:model.layers.0.mlp")
    'model.layers.0.mlp'
    >>> range_path("lm_head")
    'lm_head'
    """
    return name.rsplit(":", 1)[-1]


def scope_of(path: str, scopes: set[str]) -> str | None:
    """The deepest of ``scopes`` that is ``path`` or encloses it; None when none does.

    >>> scope_of("model.layers.0.mlp.act_fn", {"model.layers.0.mlp", "model.layers.0"})
    'model.layers.0.mlp'
    >>> scope_of("model.layers.10", {"model.layers.1"}) is None
    True
    """
    p = path
    while True:
        if p in scopes:
            return p
        if "." not in p:
            return None
        p = p.rsplit(".", 1)[0]


def module_ranges(host: Iterable[HostEvent], scopes: set[str]) -> dict[int | str, list[ModuleRange]]:
    """Per host thread, the annotations that name a module path in or under one of the graph's ``scopes``,
    sorted by start (outer first at a tie)."""
    out: dict[int | str, list[ModuleRange]] = {}
    memo: dict[str, bool] = {}
    for h in host:
        if h.kind is not SpanCategory.ANNOTATION:
            continue
        path = range_path(h.name)
        ok = memo.get(path)
        if ok is None:
            ok = memo[path] = bool(path) and scope_of(path, scopes) is not None
        if ok:
            out.setdefault(h.tid, []).append((h.ts, h.ts + h.dur, path))
    for ranges in out.values():
        ranges.sort(key=lambda r: (r[0], -r[1]))
    return out


def innermost(ranges: Sequence[ModuleRange], starts: Sequence[float], t: float) -> str | None:
    """The path of the innermost range of ``ranges`` (nested, sorted by start; ``starts`` their starts)
    around time ``t``."""
    # ranges nest: the innermost one around t is the latest-starting one that still holds t
    for i in range(bisect.bisect_right(starts, t) - 1, -1, -1):
        if t <= ranges[i][1]:
            return ranges[i][2]
    return None


@dataclass
class _Unit:
    """Kernels launched by one CPU op: the outermost one named like a graph op, else the top-level one."""

    host: HostEvent
    name: str | None
    kernels: list[GpuEvent] = field(default_factory=list)


@dataclass
class ModuleAlignment:
    """Kernels of each op (op id -> kernels) found by module ranges, and what did not line up."""

    owners: dict[int, list[GpuEvent]]
    named_ops: int
    """Graph ops lowered from one aten call, in buckets that hold kernels."""
    matched_ops: int
    """Of those, the ones whose call the trace has."""
    unaligned_scopes: list[str]
    """Scopes whose single-call ops did not all find their call."""


def align_by_modules(buckets: Sequence[Bucket], data: TraceData, ops: Sequence[OpBase]) -> ModuleAlignment | None:
    """Align the kernels of matched steps (``buckets``: their kernels, by step) with the graph's ``ops`` of
    those steps by module ranges; None when the trace has no range naming a scope of those ops."""
    scopes = {op.scope for op in ops if op.scope}
    ranges = module_ranges(data.host, scopes)
    if not ranges:
        return None
    starts = {tid: [r[0] for r in rs] for tid, rs in ranges.items()}
    names = {n for op in ops if op.call is not None and (n := aten_name(op)) is not None}
    units: dict[tuple[int, str], list[_Unit]] = {}
    by_host: dict[int, _Unit] = {}
    for b in buckets:
        for g in b.kernels:
            path_ops = chain(g)
            if not path_ops:
                continue
            top = path_ops[-1]
            rs = ranges.get(top.tid)
            path = innermost(rs, starts[top.tid], top.ts) if rs else None
            scope = scope_of(path, scopes) if path is not None else None
            if scope is None:
                continue
            host, name = top, None
            for h in reversed(path_ops):  # outermost first
                short = h.name.rsplit("::", 1)[-1]
                if short in names:
                    host, name = h, short
                    break
            u = by_host.get(id(host))
            if u is None:
                u = by_host[id(host)] = _Unit(host, name)
                units.setdefault((b.step, scope), []).append(u)
            u.kernels.append(g)
    graph_buckets: dict[tuple[int, str], list[OpBase]] = {}
    for op in ops:
        graph_buckets.setdefault((op.step or 0, op.scope), []).append(op)
    cpu = CpuOps(data.host)
    owners: dict[int, list[GpuEvent]] = {}
    named_total = matched_total = 0
    unaligned: list[str] = []
    for key, bucket_units in units.items():
        bucket_ops = graph_buckets.get(key, [])
        if not bucket_ops:
            continue
        # in kernel order: a call whose own kernels follow those of a call inside it (``matmul``'s layout copy
        # of a transposed query, then its GEMM) comes after that call, as the graph has them
        bucket_units.sort(key=lambda u: (u.kernels[0].ts, u.host.ts))
        got, named, matched = _align_bucket(bucket_ops, bucket_units, cpu)
        owners.update(got)
        named_total += named
        matched_total += matched
        if matched < named:
            unaligned.append(key[1])
    return ModuleAlignment(owners, named_total, matched_total, list(dict.fromkeys(unaligned)))


def _align_bucket(
    ops: Sequence[OpBase], units: Sequence[_Unit], cpu: CpuOps | None = None
) -> tuple[dict[int, list[GpuEvent]], int, int]:
    """One bucket: named ops matched to named units as sequences; the rest to the fused ops between.
    (owners, named ops, matched named ops)."""
    named = [(i, n) for i, op in enumerate(ops) if op.call is not None and (n := aten_name(op)) is not None]
    takers_at = [i for i, op in enumerate(ops) if op.call is None or aten_name(op) is None]
    unit_named = [(j, u.name) for j, u in enumerate(units) if u.name is not None]
    matcher = difflib.SequenceMatcher(None, [n for _, n in named], [n for _, n in unit_named], autojunk=False)
    owners: dict[int, list[GpuEvent]] = {}
    anchors: list[tuple[int, int]] = []  # (op position, unit position) of each match, in order
    for a, b, size in matcher.get_matching_blocks():
        for t in range(size):
            i, j = named[a + t][0], unit_named[b + t][0]
            owners.setdefault(ops[i].id, []).extend(units[j].kernels)
            anchors.append((i, j))
    matched_units = {j for _, j in anchors}
    bounds = [(-1, -1), *anchors, (len(ops), len(units))]
    for (i1, j1), (i2, j2) in itertools.pairwise(bounds):
        left = [units[j] for j in range(j1 + 1, j2) if j not in matched_units]
        takers = [ops[i] for i in takers_at if i1 < i < i2]
        if left and takers:
            for op_id, ks in share(takers, left, cpu).items():
                owners.setdefault(op_id, []).extend(ks)
    return owners, len(named), len(anchors)


def _is_gemm(u: _Unit) -> bool:
    """A unit that runs a GEMM: a GEMM kernel, or one launched right by a matmul op (not a copy that a
    ``_grouped_mm`` call makes before its GEMMs)."""
    return any(kind_of(g) == "gemm" or (g.launch_op or "").endswith("mm") for g in u.kernels)


def _top(h: HostEvent) -> HostEvent:
    while h.parent is not None:
        h = h.parent
    return h


class CpuOps:
    """A thread's CPU ops by start, to find the calls inside one that launched nothing (an ``mm`` of an
    expert that got no tokens)."""

    def __init__(self, host: Iterable[HostEvent]) -> None:
        by_tid: dict[int | str, list[HostEvent]] = {}
        for h in host:
            if h.kind is SpanCategory.CPU_OP:
                by_tid.setdefault(h.tid, []).append(h)
        self.ops = {tid: sorted(hs, key=lambda h: (h.ts, -h.dur)) for tid, hs in by_tid.items()}
        self.starts = {tid: [h.ts for h in hs] for tid, hs in self.ops.items()}

    def inside(self, call: HostEvent, names: set[str]) -> list[HostEvent]:
        """The outermost ops named ``names`` within ``call`` (itself left out), in order."""
        hs, starts = self.ops.get(call.tid, []), self.starts.get(call.tid, [])
        out: list[HostEvent] = []
        end = call.ts + call.dur
        for h in hs[bisect.bisect_left(starts, call.ts) : bisect.bisect_right(starts, end)]:
            if h is call or h.name not in names or h.ts + h.dur > end + 1e-6:
                continue
            if out and out[-1].ts + out[-1].dur >= h.ts + h.dur - 1e-6:
                continue  # inside the previous one
            out.append(h)
        return out


def _pieces(units: Sequence[_Unit], cpu: CpuOps | None) -> list[tuple[bool, list[GpuEvent]]]:
    """Units as (GEMM?, kernels) pieces: within one top-level call that runs GEMMs (torch's per-expert
    ``_grouped_mm`` fallback: a copy, then one ``mm`` per expert with a host sync between), each GEMM call
    with the units before it is a piece, a GEMM call that launched nothing (an expert without tokens) an
    empty one; any other unit is a piece of its own."""
    out: list[tuple[bool, list[GpuEvent]]] = []
    for _, grp in itertools.groupby(units, key=lambda u: id(_top(u.host))):
        run = list(grp)
        gemm_hosts = [u.host for u in run if _is_gemm(u)]
        if not gemm_hosts:
            out += [(False, list(u.kernels)) for u in run]
            continue
        top = _top(run[0].host)
        calls = cpu.inside(top, {h.name for h in gemm_hosts}) if cpu is not None else []
        if not {id(h) for h in gemm_hosts} <= {id(h) for h in calls}:
            calls = gemm_hosts
        of_host = {id(u.host): u for u in run}
        pending: list[GpuEvent] = []
        rest = iter(run)
        for h in calls:
            u = of_host.get(id(h))
            if u is not None:
                # the units before this GEMM call (a copy, a host sync's memcpy) go with it
                for v in rest:
                    pending += v.kernels
                    if v is u:
                        break
            out.append((True, pending))
            pending = []
        for v in rest:
            pending += v.kernels
        if pending:
            out[-1][1].extend(pending)
    return out


def share(takers: Sequence[OpBase], units: Sequence[_Unit], cpu: CpuOps | None = None) -> dict[int, list[GpuEvent]]:
    """Kernels of unmatched units (time order) among fused ops (graph order): runs of GEMM pieces go to runs
    of GEMM ops one piece per op (the experts of an MoE block, in order), the other runs are split as
    :func:`opgraph.compare.align.segment` splits them (RoPE of q, then of k); runs are paired by type, in
    order, and a run with no partner joins its neighbour's op."""
    pieces = _pieces(units, cpu)
    p_runs = [(t, [p for _, p in grp]) for t, grp in itertools.groupby(pieces, key=lambda p: p[0])]
    t_runs = [(t, list(grp)) for t, grp in itertools.groupby(takers, key=lambda op: op.kind in OpCategory.MATMUL)]
    matcher = difflib.SequenceMatcher(None, [t for t, _ in p_runs], [t for t, _ in t_runs], autojunk=False)
    given: list[list[OpBase] | None] = [None] * len(p_runs)
    owners: dict[int, list[GpuEvent]] = {}
    for a, b, size in matcher.get_matching_blocks():
        for k in range(size):
            gemm, parts = p_runs[a + k]
            ops = t_runs[b + k][1]
            given[a + k] = ops
            if gemm:
                for i, part in enumerate(parts):
                    owners.setdefault(ops[min(i, len(ops) - 1)].id, []).extend(part)
            else:
                kernels = [g for part in parts for g in part]
                for op, idx in zip(ops, segment(ops, kernels), strict=True):
                    if idx:
                        owners.setdefault(op.id, []).extend(kernels[i] for i in idx)
    for k, ops_k in enumerate(given):
        if ops_k is not None:
            continue
        before = next((given[i] for i in range(k - 1, -1, -1) if given[i] is not None), None)
        after = next((given[i] for i in range(k + 1, len(given)) if given[i] is not None), None)
        op = before[-1] if before is not None else after[0] if after is not None else takers[0]
        owners.setdefault(op.id, []).extend(g for part in p_runs[k][1] for g in part)
    return owners
