"""Gantt chart PNG of one or more timelines: tracks as rows, spans coloured by op kind, layers marked.

Several timelines are stacked one above the other on one shared time axis, so a simulated and a
measured run of the same graph line up. Every span of a panel is one rectangle of a single
``PolyCollection`` (one draw call, fine for hundreds of thousands of spans); spans narrower than a
pixel still show as at least a hairline. matplotlib runs on its Agg canvas through the object API,
never through pyplot's global state, so exports are safe in threads and need no display.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from opgraph.export.common import (
    ExportError,
    check_timelines,
    kind_color,
    span_kind_key,
    span_layer,
    timeline_label,
    track_order,
)
from opgraph.ir import OpGraph, Timeline, atomic_write

ROW_HEIGHT_IN = 0.32
"""Height of one track row, inches."""
MAX_LAYER_LABELS = 40
"""Above this many layers only every n-th boundary is labelled."""


def _time_unit(extent_us: float) -> tuple[str, float]:
    if extent_us >= 2e6:
        return "s", 1e-6
    if extent_us >= 2e3:
        return "ms", 1e-3
    return "us", 1.0


def layer_starts(timeline: Timeline, graph: OpGraph | None = None) -> list[tuple[int, float]]:
    """``(layer, first start)`` of each transformer layer seen in the timeline, by time."""
    first: dict[int, float] = {}
    for s in timeline.spans:
        layer = span_layer(s, graph)
        if layer is not None and (layer not in first or s.start_us < first[layer]):
            first[layer] = s.start_us
    return sorted(first.items(), key=lambda kv: kv[1])


def write_gantt(
    timelines: Sequence[Timeline],
    path: str | Path,
    *,
    title: str | None = None,
    graph: OpGraph | None = None,
    width_in: float = 14.0,
    dpi: int = 150,
) -> Path:
    """Draw ``timelines`` as a Gantt chart PNG at ``path`` (atomically) and return the path.

    One panel per timeline, tracks as rows (host threads on top), spans coloured by op kind (see
    :data:`~opgraph.export.KIND_COLORS`), dashed lines where each transformer layer starts, and a
    shared time axis in the unit that reads best. ``graph`` fills kinds and layers the spans lack.
    """
    check_timelines(timelines, "Gantt chart")
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ExportError("a Gantt chart file name must end in .png", where=str(path))
    if width_in <= 0 or dpi <= 0:
        raise ExportError("width and dpi must be positive", where="write_gantt")

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    start = min(tl.start_us for tl in timelines)
    end = max(tl.end_us for tl in timelines)
    unit, scale = _time_unit(end - start)
    rows = [track_order(tl) for tl in timelines]
    heights = [max(1, len(r)) * ROW_HEIGHT_IN + 0.45 for r in rows]
    fig = Figure(figsize=(width_in, sum(heights) + 1.3), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(timelines), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
    kinds_used: dict[str, None] = {}
    for ax, tl, tracks, index in zip(axes, timelines, rows, range(len(timelines)), strict=True):
        row_of = {t: i for i, t in enumerate(tracks)}
        n = len(tl.spans)
        x0 = np.empty(n)
        x1 = np.empty(n)
        y = np.empty(n)
        colors: list[str] = [""] * n
        for i, s in enumerate(tl.spans):
            x0[i] = (s.start_us - start) * scale
            x1[i] = (s.end_us - start) * scale
            y[i] = row_of[s.track]
            key = span_kind_key(s, graph)
            kinds_used.setdefault(key, None)
            colors[i] = kind_color(key)
        verts = np.empty((n, 4, 2))
        verts[:, 0, 0] = verts[:, 1, 0] = x0
        verts[:, 2, 0] = verts[:, 3, 0] = x1
        verts[:, 0, 1] = verts[:, 3, 1] = y - 0.38
        verts[:, 1, 1] = verts[:, 2, 1] = y + 0.38
        # Thin edges in the face colour keep sub-pixel spans visible without outlining wide ones.
        ax.add_collection(
            PolyCollection(cast(Any, verts), facecolors=colors, edgecolors=colors, linewidths=0.3, antialiaseds=False)
        )
        ax.set_ylim(len(tracks) - 0.5, -0.5)
        ax.set_yticks(range(len(tracks)), labels=tracks, fontsize=8)
        ax.set_title(timeline_label(tl, index), fontsize=9, loc="left")
        ax.grid(axis="x", color="#dddddd", linewidth=0.5)
        ax.set_axisbelow(True)
        _mark_layers(ax, layer_starts(tl, graph), start, scale)
    axes[-1].set_xlim(0, max((end - start) * scale, 1e-9) * 1.005)
    axes[-1].set_xlabel(f"time ({unit})")
    handles = [Patch(facecolor=kind_color(k), label=k) for k in sorted(kinds_used)]
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(8, len(handles)), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    with atomic_write(path) as out:
        out.write(buf.getvalue())
    return path


def _mark_layers(ax: Any, starts: list[tuple[int, float]], origin: float, scale: float) -> None:
    if not starts:
        return
    every = max(1, -(-len(starts) // MAX_LAYER_LABELS))
    for i, (layer, t) in enumerate(starts):
        x = (t - origin) * scale
        ax.axvline(x, color="#555555", linewidth=0.6, linestyle=(0, (3, 3)), zorder=3)
        if i % every == 0:
            ax.annotate(
                f"L{layer}", (x, 1), xycoords=("data", "axes fraction"), xytext=(2, -2), textcoords="offset points",
                fontsize=7, color="#333333", va="top", annotation_clip=False,
            )  # fmt: skip
