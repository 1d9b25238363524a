"""What every exporter shares: the export error, report tables, labels and the colour of each op kind."""

from __future__ import annotations

import colorsys
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from opgraph.ir import OpBase, OpGraph, OpgraphError, OpKind, Scalar, Span, Timeline
from opgraph.ir.tensor import FrozenModel
from opgraph.ir.timeline import SpanCategory


class ExportError(OpgraphError):
    """An export cannot be written: no timelines, an unknown format, a non-finite time, a busy port."""


class ServeTimeoutError(ExportError):
    """``--open`` served nothing: no request for the trace arrived before the timeout."""


class ReportTable(FrozenModel):
    """An extra titled table for the HTML report (a comparison, a calibration summary, ...)."""

    reads_unversioned: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    """Format version; the loader refuses newer versions with a clear message and reads a file without one (written
    before it was kept) as version 1."""
    title: str
    """Heading shown above the table."""
    columns: tuple[str, ...]
    """Column headings."""
    rows: tuple[tuple[Scalar, ...], ...] = ()
    """Rows, each with one value per column; floats are shown with 4 significant digits."""
    note: str = ""
    """A line shown under the table (what the numbers mean, what was left out)."""
    numeric: tuple[bool, ...] = Field(default=())
    """Which columns are right-aligned numbers; derived from the first row when left empty."""

    @model_validator(mode="after")
    def _row_widths(self) -> ReportTable:
        width = len(self.columns)
        for i, row in enumerate(self.rows):
            if len(row) != width:
                raise ValueError(f"row {i} has {len(row)} values but the table has {width} columns")
        if self.numeric and len(self.numeric) != width:
            raise ValueError(f"numeric has {len(self.numeric)} entries but the table has {width} columns")
        if not self.numeric and self.rows:
            flags = tuple(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.rows[0])
            object.__setattr__(self, "numeric", flags)
        return self


KIND_COLORS: dict[str, str] = {
    OpKind.GEMM.value: "#4C72B0",
    OpKind.ATTENTION.value: "#DD8452",
    OpKind.NORM.value: "#55A868",
    OpKind.ROPE.value: "#C44E52",
    OpKind.EMBEDDING.value: "#8172B3",
    OpKind.ACTIVATION.value: "#937860",
    OpKind.ELEMENTWISE.value: "#DA8BC3",
    OpKind.REDUCTION.value: "#8C8C8C",
    OpKind.SOFTMAX.value: "#CCB974",
    OpKind.TOPK.value: "#64B5CD",
    OpKind.MOE_ROUTING.value: "#2F4B7C",
    OpKind.COLLECTIVE.value: "#D62728",
    OpKind.MEMORY.value: "#17BECF",
    OpKind.VIEW.value: "#C7C7C7",
    OpKind.OTHER.value: "#7F7F7F",
    "host": "#BCBD22",
}
"""Fixed colour of each op kind (and of host spans), shared by the Gantt chart and the HTML report."""


def kind_color(key: str) -> str:
    """The colour of an op kind; other keys (kernel types of measured traces) get a stable hashed colour."""
    if key in KIND_COLORS:
        return KIND_COLORS[key]
    h = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
    r, g, b = colorsys.hls_to_rgb((h % 360) / 360.0, 0.55, 0.55)
    return f"#{round(r * 255):02X}{round(g * 255):02X}{round(b * 255):02X}"


def host_tracks(timeline: Timeline) -> set[str]:
    """Tracks that hold no device work (host threads, annotation rows)."""
    device = {s.track for s in timeline.spans if s.on_device}
    return {t for t in timeline.tracks() if t not in device}


def track_order(timeline: Timeline) -> list[str]:
    """Tracks in display order: host threads first (they issue the work), then engines and streams."""
    host = host_tracks(timeline)
    return sorted(timeline.tracks(), key=lambda t: (t not in host, natural_key(t)))


def span_op(span: Span, graph: OpGraph | None) -> OpBase | None:
    """The graph op a span runs, when the graph is given and has it."""
    if graph is None or span.op_id is None:
        return None
    try:
        return graph.op(span.op_id)
    except KeyError:
        return None


def op_kind(op: OpBase) -> str:
    """The kind of a graph op as a string (every concrete op class has a ``kind`` field)."""
    kind = op.kind if hasattr(op, "kind") else OpKind.OTHER
    return str(kind.value)


def span_kind_key(span: Span, graph: OpGraph | None = None) -> str:
    """What a span is, for grouping and colour: the op kind, else the graph op's kind, else its category."""
    if span.kind is not None:
        return span.kind.value
    op = span_op(span, graph)
    if op is not None:
        return op_kind(op)
    if span.category is not None:
        category = SpanCategory(span.category)
        return category.value if category.is_device else "host"
    return OpKind.OTHER.value


def span_layer(span: Span, graph: OpGraph | None = None) -> int | None:
    """The span's transformer layer, from the span or else from its graph op."""
    if span.layer is not None:
        return span.layer
    op = span_op(span, graph)
    return op.layer if op is not None else None


def timeline_label(timeline: Timeline, index: int) -> str:
    """A short, unique-enough label: ``simulated: llama-1b on H100`` (falls back to the index)."""
    src = timeline.source
    label = src.name or (Path(src.trace_file).name if src.trace_file else "") or src.graph_model
    if src.device and src.device not in label:
        label = f"{label} on {src.device}" if label else src.device
    return f"{src.kind.value}: {label}" if label else f"{src.kind.value} #{index}"


_NUM = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders ``engine2`` before ``engine10``."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _NUM.split(text) if p)


def check_timelines(timelines: Sequence[Timeline], what: str) -> None:
    """Raise :class:`ExportError` unless ``timelines`` is a non-empty sequence of timelines."""
    if not timelines:
        raise ExportError(f"{what} needs at least one timeline", hint="pass one or more saved Timeline files")
    for i, tl in enumerate(timelines):
        if not isinstance(tl, Timeline):
            raise ExportError(f"item {i} is a {type(tl).__name__}, not a Timeline", where=what)
