"""The numbers behind the report: time by kind, layer and track, top ops, the critical path, comparisons.

Plain functions of timelines (and the graph, when given) returning small frozen dataclasses or
:class:`~opgraph.export.ReportTable` rows; the HTML template only lays them out.

Device time is the sum of the durations of device work (:attr:`opgraph.ir.Span.on_device`: kernels,
device copies, simulated ops); host spans (CPU ops, runtime calls, annotations, simulated issue) are
left out of it, because they issue the same work and would count it twice. A timeline with no device
work at all (a CPU-only profile) is summarised over all its spans.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opgraph.compare import CompareError, JoinMode, compare_timelines
from opgraph.export.common import (
    ReportTable,
    host_tracks,
    natural_key,
    op_kind,
    span_kind_key,
    span_layer,
    span_op,
    timeline_label,
)

# The formatters live in opgraph.fmt (their one home); re-exported for the report template and callers.
from opgraph.fmt import fmt_count as fmt_count
from opgraph.fmt import fmt_pct as fmt_pct
from opgraph.fmt import fmt_us as fmt_us
from opgraph.ir import OpGraph, Span, Timeline, TimelineKind, critical_path

TOP_OPS = 20
"""Rows in the top-ops table."""
CRITICAL_PATH_ROWS = 25
"""Rows of the critical-path op table (longest ops on the path)."""


def fmt_err(pred: float, ref: float) -> str:
    """Signed relative error of ``pred`` against ``ref`` (``+12.3%``); ``n/a`` without a reference."""
    if ref == 0:
        return "n/a"
    return f"{(pred - ref) / ref * 100:+.1f}%"


@dataclass(frozen=True)
class GroupRow:
    """Device time of one group of spans (a kind, a layer)."""

    key: str
    spans: int
    total_us: float
    share: float
    """Fraction of the timeline's device time."""


@dataclass(frozen=True)
class TrackRow:
    """How busy one track was."""

    track: str
    spans: int
    busy_us: float
    utilisation: float
    """Busy time over the timeline's makespan."""
    host: bool


@dataclass(frozen=True)
class TopOp:
    """Spans of one name, aggregated."""

    name: str
    kind: str
    spans: int
    total_us: float
    mean_us: float
    max_us: float
    share: float


@dataclass(frozen=True)
class TimelineSummary:
    """Everything the report shows about one timeline."""

    index: int
    label: str
    kind: str
    device: str
    spans: int
    device_spans: int
    tracks: int
    makespan_us: float
    wall_us: float | None
    device_time_us: float
    flops: int
    bytes: int
    by_kind: tuple[GroupRow, ...]
    by_layer: tuple[GroupRow, ...]
    track_rows: tuple[TrackRow, ...]
    top_ops: tuple[TopOp, ...]
    config: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]
    by_step: tuple[GroupRow, ...] = ()
    """Device time per step (forward pass); empty for a single step."""
    by_stage: tuple[GroupRow, ...] = ()
    """Device time per stage (prefill/decode)."""

    @property
    def achieved_flops(self) -> float:
        """FLOP/s over the makespan (0 without FLOPs)."""
        return self.flops / (self.makespan_us * 1e-6) if self.makespan_us > 0 else 0.0


def device_spans(timeline: Timeline) -> list[Span]:
    """The spans that count as device time (:meth:`opgraph.ir.Timeline.device_spans`), or every span of a
    timeline with no device work (a CPU-only profile)."""
    dev = timeline.device_spans()
    return dev if dev else list(timeline.spans)


def _groups(items: Iterable[tuple[str, float]], total: float) -> dict[str, list[float]]:
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for key, dur in items:
        row = acc[key]
        row[0] += 1
        row[1] += dur
    return acc


def _rows(acc: dict[str, list[float]], total: float) -> list[GroupRow]:
    return [GroupRow(k, int(v[0]), v[1], v[1] / total if total > 0 else 0.0) for k, v in acc.items()]


def time_by_kind(spans: Sequence[Span], graph: OpGraph | None = None) -> tuple[GroupRow, ...]:
    """Device time per op kind, largest first."""
    total = sum(s.dur_us for s in spans)
    rows = _rows(_groups(((span_kind_key(s, graph), s.dur_us) for s in spans), total), total)
    return tuple(sorted(rows, key=lambda r: (-r.total_us, r.key)))


_STAGE_RANK = {"prefill": 0, "decode": 1}


def _span_step(s: Span, graph: OpGraph | None) -> int | None:
    if s.step is not None:
        return s.step
    op = span_op(s, graph)
    return op.step if op is not None else None


def _span_stage(s: Span, graph: OpGraph | None) -> str:
    if s.stage is not None:
        return s.stage.value
    op = span_op(s, graph)
    return op.stage.value if op is not None and op.stage is not None else ""


def time_by_layer(spans: Sequence[Span], graph: OpGraph | None = None) -> tuple[GroupRow, ...]:
    """Device time per transformer layer (``L3``), then the time outside layers (``other``), in layer order.

    With several steps (forward passes) the layers are the model's, counted from each step's first layer
    (a measured trace numbers them 0..799 across 10 steps), and summed per stage: ``prefill L3``,
    ``decode L3`` (over all decode steps)."""
    total = sum(s.dur_us for s in spans)
    layered = [(s, span_layer(s, graph), _span_step(s, graph)) for s in spans]
    steps = {step for _, layer, step in layered if layer is not None and step is not None}
    if len(steps) <= 1:
        acc = _groups(((_layer_key(layer), s.dur_us) for s, layer, _ in layered), total)
        return tuple(sorted(_rows(acc, total), key=lambda r: (r.key == "other", natural_key(r.key))))
    first: dict[int, int] = {}
    for _, layer, step in layered:
        if layer is not None and step is not None:
            first[step] = min(first.get(step, layer), layer)

    def key(s: Span, layer: int | None, step: int | None) -> str:
        if layer is None:
            return "other"
        local = layer - first.get(step, 0) if step is not None else layer
        stage = _span_stage(s, graph) or (f"step {step}" if step is not None else "")
        return f"{stage} L{local}".strip()

    acc = _groups(((key(s, layer, step), s.dur_us) for s, layer, step in layered), total)

    def order(r: GroupRow) -> tuple[bool, int, tuple[tuple[int, int | str], ...]]:
        head = r.key.rsplit(" L", 1)[0] if " L" in r.key else ""
        return (r.key == "other", _STAGE_RANK.get(head, 2), natural_key(r.key))

    return tuple(sorted(_rows(acc, total), key=order))


def time_by_step(spans: Sequence[Span], graph: OpGraph | None = None) -> tuple[GroupRow, ...]:
    """Device time per step (forward pass), ``step 3 (decode)``, in step order; empty for one step."""
    total = sum(s.dur_us for s in spans)
    stage_of: dict[int, str] = {}
    items = []
    for s in spans:
        step = _span_step(s, graph)
        if step is None:
            items.append(("no step", s.dur_us))
            continue
        stage_of.setdefault(step, _span_stage(s, graph))
        items.append((str(step), s.dur_us))
    if len(stage_of) <= 1:
        return ()
    acc = _groups(items, total)
    rows = []
    for r in _rows(acc, total):
        if r.key.isdigit() and stage_of.get(int(r.key)):
            r = GroupRow(f"step {r.key} ({stage_of[int(r.key)]})", r.spans, r.total_us, r.share)
        elif r.key.isdigit():
            r = GroupRow(f"step {r.key}", r.spans, r.total_us, r.share)
        rows.append(r)
    return tuple(sorted(rows, key=lambda r: (r.key == "no step", natural_key(r.key))))


def time_by_stage(spans: Sequence[Span], graph: OpGraph | None = None) -> tuple[GroupRow, ...]:
    """Device time per stage (prefill, decode, then spans without one)."""
    total = sum(s.dur_us for s in spans)
    acc = _groups(((_span_stage(s, graph) or "no stage", s.dur_us) for s in spans), total)
    return tuple(sorted(_rows(acc, total), key=lambda r: (_STAGE_RANK.get(r.key, 2), r.key)))


def _layer_key(layer: int | None) -> str:
    return "other" if layer is None else f"L{layer}"


def summarize(timeline: Timeline, index: int = 0, graph: OpGraph | None = None) -> TimelineSummary:
    """The report's numbers for one timeline."""
    dev = device_spans(timeline)
    total = sum(s.dur_us for s in dev)
    makespan = timeline.makespan_us
    host = host_tracks(timeline)
    counts: dict[str, int] = defaultdict(int)
    for s in timeline.spans:
        counts[s.track] += 1
    tracks = sorted(timeline.tracks(), key=lambda t: (t not in host, natural_key(t)))
    track_rows = tuple(
        TrackRow(t, counts[t], b, b / makespan if makespan > 0 else 0.0, t in host)
        for t in tracks
        for b in (timeline.busy_us(t),)
    )
    top: dict[str, list[float]] = {}
    kinds: dict[str, str] = {}
    for s in dev:
        row = top.setdefault(s.name, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += s.dur_us
        row[2] = max(row[2], s.dur_us)
        kinds.setdefault(s.name, span_kind_key(s, graph))
    top_ops = sorted(top.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP_OPS]
    flops = 0
    nbytes = 0
    seen: set[int] = set()
    for s in dev:
        if s.op_id is not None and s.op_id in seen:
            continue
        op = span_op(s, graph)
        if op is not None:
            seen.add(op.id)
            flops += op.flops
            nbytes += op.total_bytes
        else:
            f = s.args.get("flops")
            if isinstance(f, (int, float)) and not isinstance(f, bool):
                flops += int(f)
    src = timeline.source
    config = tuple((k, str(v)) for k, v in src.config.items())
    if src.trace_file:
        config = (("trace file", src.trace_file), *config)
    return TimelineSummary(
        index=index,
        label=timeline_label(timeline, index),
        kind=src.kind.value,
        device=src.device,
        spans=len(timeline.spans),
        device_spans=len(dev),
        tracks=len(tracks),
        makespan_us=makespan,
        wall_us=timeline.wall_us,
        device_time_us=total,
        flops=flops,
        bytes=nbytes,
        by_kind=time_by_kind(dev, graph),
        by_layer=time_by_layer(dev, graph),
        by_step=time_by_step(dev, graph),
        by_stage=time_by_stage(dev, graph),
        track_rows=track_rows,
        top_ops=tuple(
            TopOp(name, kinds[name], int(v[0]), v[1], v[1] / v[0], v[2], v[1] / total if total > 0 else 0.0)
            for name, v in top_ops
        ),
        config=config,
        notes=timeline.notes,
    )


@dataclass(frozen=True)
class PathOp:
    """One op on the critical path."""

    op_id: int
    name: str
    kind: str
    layer: str
    dur_us: float


@dataclass(frozen=True)
class CriticalPathSummary:
    """The critical path of the graph, weighted by one timeline's op durations."""

    timeline_label: str
    length_us: float
    makespan_us: float
    ops: int
    by_kind: tuple[GroupRow, ...]
    longest: tuple[PathOp, ...]
    """The longest ops on the path (at most :data:`CRITICAL_PATH_ROWS`), in path order."""

    @property
    def share(self) -> float:
        """Critical path over makespan: 1.0 means the schedule is as short as dependencies allow."""
        return self.length_us / self.makespan_us if self.makespan_us > 0 else 0.0


def critical_path_summary(graph: OpGraph, timelines: Sequence[Timeline]) -> CriticalPathSummary | None:
    """The critical path weighted by the first timeline whose spans carry op ids (simulated preferred)."""
    ordered = sorted(range(len(timelines)), key=lambda i: timelines[i].source.kind is not TimelineKind.SIMULATED)
    for i in ordered:
        tl = timelines[i]
        dur: dict[int, float] = defaultdict(float)
        for s in device_spans(tl):
            if s.op_id is not None:
                dur[s.op_id] += s.dur_us
        if not dur:
            continue
        cp = critical_path(graph, dur)
        by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        path_ops: list[PathOp] = []
        for op_id in cp.ops:
            op = graph.op(op_id)
            kind = op_kind(op)
            by_kind[kind][0] += 1
            by_kind[kind][1] += dur.get(op_id, 0.0)
            path_ops.append(PathOp(op_id, op.definition, kind, _layer_key(op.layer), dur.get(op_id, 0.0)))
        keep = {id(p) for p in sorted(path_ops, key=lambda p: -p.dur_us)[:CRITICAL_PATH_ROWS]}
        rows = sorted(_rows(by_kind, cp.length), key=lambda r: -r.total_us)
        return CriticalPathSummary(
            timeline_label=timeline_label(tl, i),
            length_us=cp.length,
            makespan_us=tl.makespan_us,
            ops=len(cp.ops),
            by_kind=tuple(rows),
            longest=tuple(p for p in path_ops if id(p) in keep),
        )
    return None


def _by(spans: Sequence[Span], graph: OpGraph | None, key: str) -> dict[str, float]:
    rows = time_by_kind(spans, graph) if key == "kind" else time_by_layer(spans, graph)
    return {r.key: r.total_us for r in rows}


def _is_foreign_trace(measured: Timeline, predicted: Timeline) -> bool:
    """A measured timeline without op ids against one with them (a simulation): a trace opgraph did not make."""
    if measured.source.kind is not TimelineKind.MEASURED:
        return False
    if any(s.op_id is not None for s in measured.spans):
        return False
    return any(s.op_id is not None for s in predicted.spans)


def comparison_tables(
    measured: Timeline, predicted: Timeline, *, graph: OpGraph | None = None, labels: tuple[str, str] = ("", "")
) -> list[ReportTable]:
    """Tables of ``predicted`` against ``measured``: end to end, by kind, by layer and, when both carry op ids,
    the ops with the largest absolute error."""
    m_label = labels[0] or timeline_label(measured, 0)
    p_label = labels[1] or timeline_label(predicted, 1)
    if _is_foreign_trace(measured, predicted):
        # a trace opgraph did not make: steps, layers and aten calls aligned, rank r against rank r
        from opgraph.compare import compare_measured
        from opgraph.compare import comparison_tables as compare_tables

        c = compare_measured(predicted, measured, graph=graph, top=TOP_OPS)
        return [
            ReportTable(
                title=f"{t} ({p_label} vs {m_label})" if i == 0 else t,
                columns=tuple(cols),
                rows=tuple(tuple(r) for r in rows),
            )
            for i, (t, cols, rows) in enumerate(compare_tables(c))
            if rows
        ]
    m_dev, p_dev = device_spans(measured), device_spans(predicted)
    cols = ("", "measured", "predicted", "error")
    end_rows: list[tuple[str, str, str, str]] = [
        ("makespan", fmt_us(measured.makespan_us), fmt_us(predicted.makespan_us),
         fmt_err(predicted.makespan_us, measured.makespan_us)),
        ("device time", fmt_us(sum(s.dur_us for s in m_dev)), fmt_us(sum(s.dur_us for s in p_dev)),
         fmt_err(sum(s.dur_us for s in p_dev), sum(s.dur_us for s in m_dev))),
        ("device spans", str(len(m_dev)), str(len(p_dev)), fmt_err(len(p_dev), len(m_dev))),
    ]  # fmt: skip
    if measured.wall_us is not None:
        p_wall = predicted.wall_us if predicted.wall_us is not None else predicted.makespan_us
        end_rows.append(("wall time", fmt_us(measured.wall_us), fmt_us(p_wall), fmt_err(p_wall, measured.wall_us)))
    tables = [
        ReportTable(
            title=f"End to end: {p_label} vs {m_label}",
            columns=cols,
            rows=tuple(end_rows),
            numeric=(False, True, True, True),
        )
    ]
    for key, title in (("kind", "By op kind"), ("layer", "By layer")):
        m, p = _by(m_dev, graph, key), _by(p_dev, graph, key)
        keys = list(m) + [k for k in p if k not in m]
        if key == "layer":
            keys.sort(key=lambda k: (k == "other", natural_key(k)))
        rows = tuple(
            (k, fmt_us(m.get(k, 0.0)), fmt_us(p.get(k, 0.0)), fmt_err(p.get(k, 0.0), m.get(k, 0.0))) for k in keys
        )
        tables.append(
            ReportTable(
                title=f"{title}: {p_label} vs {m_label}",
                columns=(key, "measured", "predicted", "error"),
                rows=rows,
                numeric=(False, True, True, True),
                note="error = (predicted - measured) / measured; device time summed over spans",
            )
        )
    try:
        joined = compare_timelines(
            predicted, measured, join=JoinMode.OP_ID, graph=graph, top=TOP_OPS, allow_different_models=True
        )
    except CompareError:  # no op ids shared: no per-op table
        joined = None
    if joined is not None and joined.top_gaps:
        gap_rows = tuple(
            (
                e.op_id,
                e.definition or e.key,
                fmt_us(e.reference_us),
                fmt_us(e.predicted_us),
                fmt_err(e.predicted_us, e.reference_us),
            )
            for e in joined.top_gaps
        )
        tables.append(
            ReportTable(
                title=f"Largest per-op errors ({joined.matched} ops joined by op id)",
                columns=("op", "name", "measured", "predicted", "error"),
                rows=gap_rows,
                numeric=(True, False, True, True, True),
            )
        )
    return tables
