"""Timelines to the Chrome Trace Event Format, as Perfetto, chrome://tracing and HTA read it.

Layout of an exported file (Kineto's conventions where they cost nothing, so HolisticTraceAnalysis
and our own importer read it back):

- one process per timeline (``pid`` = its index; simulated, measured and replay side by side), named
  and ordered by ``M`` metadata events; ``deviceProperties`` lists the device of each process;
- one thread per track (engine, stream, host thread); a track named ``stream N`` (or ``gpu0/streamN``) keeps ``tid`` N,
  other tracks get free small integers; named and ordered by ``M`` events;
- one complete ``X`` event per span, ``cat: "kernel"`` (or ``gpu_memcpy``/``gpu_memset``) for device
  work (with Kineto's ``device``, ``stream`` and ``correlation`` args) and Kineto's host categories
  (``cpu_op``, ``cuda_runtime``, ``user_annotation``, ...) for host spans; the args carry the op id,
  kind, definition, layer, stage, step, the cost model's bound and, from the graph when one is given,
  target, scope, dtype, FLOPs, bytes and shapes (Kineto's ``Input Dims`` / ``Input type`` /
  ``Output Dims``);
- optional flow events (``s``/``f``, binding to the enclosing slices) for the graph's data edges;
- one counter track per track, ``utilisation <track>``, with the percentage of each time bin it was busy.

All times go through :func:`trace_time`. Events after the metadata are sorted by timestamp; the
file is written event by event (valid JSON at any size, never one list in memory) into a temporary
file renamed into place, gzip-compressed for a ``.json.gz`` name.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import re
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from opgraph.export.common import (
    ExportError,
    check_timelines,
    host_tracks,
    natural_key,
    op_kind,
    span_op,
    timeline_label,
)
from opgraph.ir import EdgeKind, OpGraph, Span, Timeline, atomic_write
from opgraph.ir.timeline import Bound, SpanCategory

NS_PER_US = 1000
"""Trace timestamps are microseconds with nanosecond resolution, as Kineto writes them."""

BATCH_EVENTS = 4096
"""Events encoded and written together (one line of the output file)."""

COUNTER_BINS = 200
"""Time bins of the utilisation counter tracks of each timeline."""

KINETO_CATEGORIES: dict[SpanCategory, str] = {
    SpanCategory.MEMCPY: "gpu_memcpy",
    SpanCategory.MEMSET: "gpu_memset",
    SpanCategory.HOST: "cpu_op",
    SpanCategory.CPU_OP: "cpu_op",
    SpanCategory.RUNTIME: "cuda_runtime",
    SpanCategory.ANNOTATION: "user_annotation",
    SpanCategory.GPU_ANNOTATION: "gpu_user_annotation",
    SpanCategory.PYTHON: "python_function",
}
"""The event ``cat`` of each span category that is not a kernel (every other device category is ``kernel``)."""

_DEVICE_EVENT_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

FLOW_CATEGORY = "opgraph.data"
"""``cat`` of the flow events drawn for data dependencies."""

# "stream 7", "CUDA stream 7", and the importer's "gpu0/stream7" or "rank1/gpu0/stream7".
_STREAM_TRACK = re.compile(r"^\s*(?:.*/)?(?:(?:cuda|hip|gpu)\s*)?stream\s*[:#=]?\s*(\d+)\s*$", re.IGNORECASE)


def trace_time(us: float) -> float:
    """The one conversion from timeline microseconds to trace-event microseconds (rounded to whole ns)."""
    # Integer nanoseconds, then one division: exact decimals, and much faster than round(x, 3).
    return round(us * NS_PER_US) / NS_PER_US


def trace_span_times(start_us: float, dur_us: float) -> tuple[float, float]:
    """``(ts, dur)`` of a span; the end is rounded, not the duration, so back-to-back spans stay adjacent."""
    ts_ns = round(start_us * NS_PER_US)
    return ts_ns / NS_PER_US, (round((start_us + dur_us) * NS_PER_US) - ts_ns) / NS_PER_US


def event_category(span: Span) -> str:
    """The event ``cat`` of a span, as Kineto writes it: ``kernel`` for device work (no category: a simulated
    op), ``gpu_memcpy``/``gpu_memset`` for copies, and the host categories (``cpu_op``, ``cuda_runtime``, ...)."""
    if span.category is None:
        return "kernel"
    return KINETO_CATEGORIES.get(SpanCategory(span.category), "kernel")


def assign_tids(tracks: Sequence[str]) -> dict[str, int]:
    """Thread ids of tracks: ``stream N`` keeps N (as Kineto numbers streams), others get the smallest free ids."""
    tids: dict[str, int] = {}
    used: set[int] = set()
    for t in tracks:
        m = _STREAM_TRACK.match(t)
        if m and int(m.group(1)) not in used:
            tids[t] = int(m.group(1))
            used.add(tids[t])
    nxt = 1
    for t in tracks:
        if t in tids:
            continue
        while nxt in used:
            nxt += 1
        tids[t] = nxt
        used.add(nxt)
    return tids


@dataclass(frozen=True)
class _Process:
    pid: int
    timeline: Timeline
    label: str
    tids: dict[str, int]
    host_tracks: frozenset[str]


def _processes(timelines: Sequence[Timeline]) -> list[_Process]:
    procs = []
    for pid, tl in enumerate(timelines):
        procs.append(_Process(pid, tl, timeline_label(tl, pid), assign_tids(tl.tracks()), frozenset(host_tracks(tl))))
    return procs


def _track_order(proc: _Process) -> list[str]:
    # Host threads first (they issue the work), then engines and streams in natural order.
    return sorted(proc.tids, key=lambda t: (t not in proc.host_tracks, natural_key(t)))


def check_finite(timeline: Timeline, index: int = 0) -> None:
    """Raise :class:`ExportError` naming the first span with a non-finite start or duration."""
    isfinite = math.isfinite
    for span in timeline.spans:
        if not (isfinite(span.start_us) and isfinite(span.dur_us)):
            what = "start" if not isfinite(span.start_us) else "duration"
            value = span.start_us if what == "start" else span.dur_us
            raise ExportError(
                f"span {span.name!r} on track {span.track!r} has a non-finite {what} ({value})",
                where=f"timeline {index}",
                hint="fix the timeline that produced it",
            )


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def span_args(span: Span, *, graph: OpGraph | None = None) -> dict[str, Any]:
    """The ``args`` of a span's event: its own attributes, then the graph op's details when a graph is given."""
    # Hot path (once per span): plain attribute reads and no temporaries.
    args: dict[str, Any] = {k: _json_safe(v) for k, v in span.args.items()} if span.args else {}
    op = span_op(span, graph) if graph is not None else None
    if span.op_id is not None:
        args["op_id"] = span.op_id
    if span.kind is not None:
        args["kind"] = span.kind.value
    elif op is not None:
        args["kind"] = op_kind(op)
    if span.category is not None:
        args["category"] = SpanCategory(span.category).value
    if span.definition:
        args["definition"] = span.definition
    elif op is not None:
        args["definition"] = op.definition
    layer = span.layer if span.layer is not None or op is None else op.layer
    if layer is not None:
        args["layer"] = layer
    stage = span.stage if span.stage is not None or op is None else op.stage
    if stage is not None:
        args["stage"] = stage.value
    step = span.step if span.step is not None or op is None else op.step
    if step is not None:
        args["step"] = step
    if span.bound is not None:
        args["bound"] = Bound(span.bound).value
    if op is not None:
        if op.target:
            args["target"] = op.target
        if op.scope:
            args["scope"] = op.scope
        args["dtype"] = op.dtype.value
        args["flops"] = op.flops
        args["bytes_read"] = op.bytes_read
        args["bytes_written"] = op.bytes_written
        if op.inputs:
            args["Input Dims"] = [list(t.shape) for t in op.inputs]
            args["Input type"] = [t.dtype.value for t in op.inputs]
        if op.outputs:
            args["Output Dims"] = [list(t.shape) for t in op.outputs]
    return args


def metadata_events(timelines: Sequence[Timeline]) -> list[dict[str, Any]]:
    """``M`` events naming and ordering the processes (timelines) and threads (tracks)."""
    events: list[dict[str, Any]] = []
    for proc in _processes(timelines):
        src = proc.timeline.source
        events.append({"ph": "M", "name": "process_name", "pid": proc.pid, "tid": 0, "args": {"name": proc.label}})
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": proc.pid, "tid": 0, "args": {"sort_index": proc.pid}}
        )
        labels = ",".join(x for x in (src.kind.value, src.device) if x)
        events.append({"ph": "M", "name": "process_labels", "pid": proc.pid, "tid": 0, "args": {"labels": labels}})
        for order, track in enumerate(_track_order(proc)):
            tid = proc.tids[track]
            events.append({"ph": "M", "name": "thread_name", "pid": proc.pid, "tid": tid, "args": {"name": track}})
            events.append(
                {"ph": "M", "name": "thread_sort_index", "pid": proc.pid, "tid": tid, "args": {"sort_index": order}}
            )
    return events


def _span_events(proc: _Process, graph: OpGraph | None, correlation0: int) -> Iterator[dict[str, Any]]:
    corr = correlation0
    pid = proc.pid
    tids = proc.tids
    cats: dict[SpanCategory | None, str] = {}
    for span in proc.timeline.spans:
        ts, dur = trace_span_times(span.start_us, span.dur_us)
        cat = cats.get(span.category)
        if cat is None:
            cat = cats[span.category] = event_category(span)
        tid = tids[span.track]
        args = span_args(span, graph=graph)
        if cat in _DEVICE_EVENT_CATEGORIES:
            args.setdefault("device", pid)
            args["stream"] = tid
            if "correlation" not in args:
                corr += 1
                args["correlation"] = corr
        yield {"ph": "X", "cat": cat, "name": span.name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _flow_events(proc: _Process, graph: OpGraph, flow0: int) -> list[dict[str, Any]]:
    # Arrows join the device spans of ops; a host span stands in only for an op with no device span.
    first: dict[int, Span] = {}
    for s in proc.timeline.spans:
        if s.op_id is None:
            continue
        seen_span = first.get(s.op_id)
        if seen_span is None or (seen_span.track in proc.host_tracks and s.track not in proc.host_tracks):
            first[s.op_id] = s
    events: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    fid = flow0
    for e in graph.edges:
        if e.kind is not EdgeKind.DATA or (e.src, e.dst) in seen:
            continue
        src, dst = first.get(e.src), first.get(e.dst)
        # A flow into the past cannot be drawn (and is no dependency of this schedule).
        if src is None or dst is None or dst.start_us < src.start_us:
            continue
        seen.add((e.src, e.dst))
        fid += 1
        common = {"cat": FLOW_CATEGORY, "name": "data", "id": fid, "bp": "e", "pid": proc.pid}
        s_ts = trace_time(src.start_us)
        events.append({"ph": "s", **common, "tid": proc.tids[src.track], "ts": s_ts})
        events.append({"ph": "f", **common, "tid": proc.tids[dst.track], "ts": trace_time(dst.start_us)})
    events.sort(key=lambda ev: ev["ts"])
    return events


def busy_fractions(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Fraction of each bin ``[edges[i], edges[i+1])`` covered by the union of the intervals ``[starts, ends)``."""
    if len(edges) < 2:
        return np.zeros(0)
    if starts.size == 0:
        return np.zeros(len(edges) - 1)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    m_start = s[new]
    m_end = np.zeros(m_start.size)
    np.maximum.at(m_end, group, e)
    cum = np.concatenate(([0.0], np.cumsum(m_end - m_start)))
    idx = np.searchsorted(m_start, edges, side="right") - 1
    inside = np.clip(edges - m_start[np.maximum(idx, 0)], 0.0, (m_end - m_start)[np.maximum(idx, 0)])
    covered = np.where(idx >= 0, cum[np.maximum(idx, 0)] + inside, 0.0)
    width = np.diff(edges)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(width > 0, np.diff(covered) / width, 0.0)
    return np.clip(frac, 0.0, 1.0)


def _counter_events(proc: _Process, bins: int) -> list[dict[str, Any]]:
    tl = proc.timeline
    if not tl.spans or bins <= 0 or tl.makespan_us <= 0:
        return []
    # Typed arrays hold 8 bytes per time, a list of floats 32: this is the export's only O(spans) memory.
    by_track: dict[str, tuple[array[float], array[float]]] = {t: (array("d"), array("d")) for t in proc.tids}
    for s in tl.spans:
        lists = by_track[s.track]
        lists[0].append(s.start_us)
        lists[1].append(s.start_us + s.dur_us)
    edges = np.linspace(tl.start_us, tl.end_us, bins + 1)
    tracks = _track_order(proc)
    pct = {
        t: busy_fractions(np.frombuffer(by_track[t][0]), np.frombuffer(by_track[t][1]), edges) * 100.0 for t in tracks
    }
    events: list[dict[str, Any]] = []
    for i in range(bins):
        args = {t: round(float(pct[t][i]), 2) for t in tracks}
        events.append(
            {
                "ph": "C",
                "name": "utilisation",
                "pid": proc.pid,
                "tid": 0,
                "ts": trace_time(float(edges[i])),
                "args": args,
            }
        )
    events.append(
        {
            "ph": "C",
            "name": "utilisation",
            "pid": proc.pid,
            "tid": 0,
            "ts": trace_time(float(edges[-1])),
            "args": dict.fromkeys(tracks, 0.0),
        }
    )
    return events


def trace_events(
    timelines: Sequence[Timeline],
    *,
    graph: OpGraph | None = None,
    flows: bool = False,
    counter_bins: int = COUNTER_BINS,
) -> Iterator[dict[str, Any]]:
    """All events of the export, lazily: metadata first, then spans, flows and counters merged by timestamp.

    Spans are produced one at a time from each (start-sorted) timeline; only the flows (when asked
    for) and the counter samples of a timeline are held in memory.
    """
    check_timelines(timelines, "trace export")
    if flows and graph is None:
        raise ExportError("flow arrows need the graph", where="--flows", hint="pass the graph with --graph")
    for i, tl in enumerate(timelines):
        check_finite(tl, i)
    yield from metadata_events(timelines)
    procs = _processes(timelines)
    streams: list[Iterable[dict[str, Any]]] = []
    corr = 0
    fid = 0
    for proc in procs:
        streams.append(_span_events(proc, graph, corr))
        corr += len(proc.timeline.spans)
        if flows and graph is not None:
            fl = _flow_events(proc, graph, fid)
            fid += len(fl) // 2
            streams.append(fl)
        streams.append(_counter_events(proc, counter_bins))
    yield from heapq.merge(*streams, key=lambda ev: ev["ts"])


def trace_header(timelines: Sequence[Timeline], *, graph: OpGraph | None = None) -> dict[str, Any]:
    """The top-level keys besides ``traceEvents``: Kineto's ``schemaVersion``, ``deviceProperties``,
    ``distributedInfo`` and an ``opgraph`` section with each process's source (for our importer)."""
    from opgraph import __version__

    devices = [{"id": pid, "name": tl.source.device or tl.source.kind.value} for pid, tl in enumerate(timelines)]
    sources = []
    for pid, tl in enumerate(timelines):
        src = tl.source.model_dump(mode="json")
        sources.append(
            {
                "pid": pid,
                "label": timeline_label(tl, pid),
                "source": src,
                "wall_us": tl.wall_us,
                "notes": list(tl.notes),
            }
        )
    meta: dict[str, Any] = {"version": __version__, "timelines": sources}
    if graph is not None:
        meta["graph_model"] = graph.metadata.model
    return {
        "schemaVersion": 1,
        "deviceProperties": devices,
        "distributedInfo": {"rank": 0, "world_size": 1},
        "traceName": ", ".join(timeline_label(tl, i) for i, tl in enumerate(timelines)),
        "opgraph": meta,
    }


def trace_document(
    timelines: Sequence[Timeline],
    *,
    graph: OpGraph | None = None,
    flows: bool = False,
    counter_bins: int = COUNTER_BINS,
) -> dict[str, Any]:
    """The whole trace as one dict (for small timelines and tests; :func:`write_perfetto` streams instead)."""
    doc = trace_header(timelines, graph=graph)
    doc["traceEvents"] = list(trace_events(timelines, graph=graph, flows=flows, counter_bins=counter_bins))
    return doc


def _check_path(path: Path) -> None:
    name = path.name.lower()
    if not (name.endswith(".json") or name.endswith(".json.gz")):
        raise ExportError(
            "a trace file name must end in .json or .json.gz", where=str(path), hint="for example trace.json.gz"
        )


def write_events(out: IO[bytes], header: dict[str, Any], events: Iterable[dict[str, Any]]) -> int:
    """Stream a trace document to ``out``: the header keys, then ``traceEvents`` a batch of events at a time.

    Returns the number of events written. Output is valid JSON whatever the size; memory stays
    bounded by one batch of :data:`BATCH_EVENTS` events (one line of the file each).
    """
    # One encoder call per batch: the C encoder's per-call overhead dominates for small events.
    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
    # The header keeps the spaced separators: HTA finds the rank with the regex '"rank":\s+(\d+)'.
    head = json.dumps(header, ensure_ascii=False, allow_nan=False)
    out.write((head[:-1] + (', "traceEvents": [\n' if header else '"traceEvents": [\n')).encode())
    it = iter(events)
    n = 0
    while batch := list(itertools.islice(it, BATCH_EVENTS)):
        body = encode(batch)[1:-1]
        out.write(((",\n" if n else "") + body).encode())
        n += len(batch)
    out.write(b"\n]}\n")
    return n


def write_perfetto(
    timelines: Sequence[Timeline],
    path: str | Path,
    *,
    graph: OpGraph | None = None,
    flows: bool = False,
    counter_bins: int = COUNTER_BINS,
) -> Path:
    """Write ``timelines`` side by side as one Chrome/Perfetto trace (``.json`` or ``.json.gz``), atomically.

    ``graph`` adds op details (shapes, FLOPs, bytes, target) to the args of spans with op ids;
    ``flows`` also draws an arrow for every data dependency (keep it off for big graphs: two events
    per edge). ``counter_bins`` sets the resolution of the utilisation counters (0 for none).

    Examples
    --------
    >>> from opgraph.ir import Span, Timeline, TimelineSource, TimelineKind
    >>> tl = Timeline(source=TimelineSource(kind=TimelineKind.SIMULATED, name="demo"),
    ...               spans=(Span(name="gemm", track="engine0", start_us=0.0, dur_us=5.0),))
    >>> import tempfile, json, pathlib
    >>> p = write_perfetto([tl], pathlib.Path(tempfile.mkdtemp()) / "t.json")
    >>> [e["name"] for e in json.loads(p.read_text())["traceEvents"] if e["ph"] == "X"]
    ['gemm']
    """
    path = Path(path)
    _check_path(path)
    check_timelines(timelines, "trace export")
    if counter_bins < 0:
        raise ExportError(f"counter_bins must be 0 or more, got {counter_bins}", where="counter_bins")
    header = trace_header(timelines, graph=graph)
    events = trace_events(timelines, graph=graph, flows=flows, counter_bins=counter_bins)
    with atomic_write(path) as out:
        write_events(out, header, events)
    return path
