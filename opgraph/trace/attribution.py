"""Kernel time per launching CPU op: which aten call (or custom op) each device event ran for.

Every kernel, memset and memcpy that a runtime call in the trace launched is attributed to the innermost
CPU op around that call (``aten::mm``, ``aten::_flash_attention_forward``), as TraceLens's
``ops_summary`` does ("direct kernel time"). Device events whose launch is not in the trace (work
queued before the profiler window opened) are counted apart; busy and idle time are those of the
attributed events, from the first one's start to the last one's end.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from opgraph.ir.tensor import FrozenModel
from opgraph.ir.timeline import Timeline, union_length
from opgraph.trace.events import GpuEvent, TraceData
from opgraph.trace.importer import collect_all, from_timeline


class OpKernelTime(FrozenModel):
    """Device time attributed to one CPU op name."""

    op: str
    """CPU op name (``aten::mm``)."""
    calls: int
    """Calls of the op that launched device work."""
    events: int
    """Device events (kernels, memsets, memcpys) they launched."""
    time_us: float
    """Summed duration of those events."""
    pct: float
    """Share of all attributed device time."""


class KernelAttribution(FrozenModel):
    """Device time per launching CPU op of one rank, with the busy and idle time of the attributed work."""

    source: str
    rows: tuple[OpKernelTime, ...]
    """One row per op name, most time first."""
    attributed_us: float
    """Device time of events with a launching CPU op in the trace."""
    unattributed_us: float
    """Device time of events without one (launched before the window, or no CPU ops recorded)."""
    unattributed_events: int
    busy_us: float
    """Union of the attributed events' intervals."""
    idle_us: float
    """Gaps between them, from the first attributed event's start to the last one's end."""

    def row(self, op: str) -> OpKernelTime:
        """The row of ``op`` (KeyError when the op launched nothing)."""
        for r in self.rows:
            if r.op == op:
                return r
        raise KeyError(op)


def _data(trace: TraceData | Timeline | str | Path, rank: int | None) -> TraceData:
    if isinstance(trace, TraceData):
        return trace
    if isinstance(trace, Timeline):
        return from_timeline(trace, link=True)
    datas = collect_all(trace)
    if rank is None:
        return datas[0]
    for d in datas:
        if d.rank == rank:
            return d
    raise KeyError(f"no rank {rank} in {trace}")


def attribute_kernels(trace: TraceData | Timeline | str | Path, *, rank: int | None = None) -> KernelAttribution:
    """Device time per launching CPU op of a trace (one rank: ``rank``, default the first)."""
    data = _data(trace, rank)
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    calls: dict[str, set[int]] = defaultdict(set)
    attributed: list[GpuEvent] = []
    loose_us = 0.0
    loose = 0
    for g in data.gpu:
        if g.launch_op is None:
            loose += 1
            loose_us += g.dur
            continue
        attributed.append(g)
        row = acc[g.launch_op]
        row[0] += 1
        row[1] += g.dur
        ident = id(g.launch_host) if g.launch_host is not None else (g.external_id or g.correlation or id(g))
        calls[g.launch_op].add(ident)
    total = sum(r[1] for r in acc.values())
    busy = union_length((g.ts, g.ts + g.dur) for g in attributed)
    extent = max((g.ts + g.dur for g in attributed), default=0.0) - min((g.ts for g in attributed), default=0.0)
    rows = tuple(
        OpKernelTime(
            op=op,
            calls=len(calls[op]),
            events=int(r[0]),
            time_us=round(r[1], 3),
            pct=round(100 * r[1] / total, 3) if total else 0.0,
        )
        for op, r in sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0]))
    )
    return KernelAttribution(
        source=data.file,
        rows=rows,
        attributed_us=round(total, 3),
        unattributed_us=round(loose_us, 3),
        unattributed_events=loose,
        busy_us=round(busy, 3),
        idle_us=round(max(extent - busy, 0.0), 3),
    )
