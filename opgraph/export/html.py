"""The HTML report: one self-contained file (inline CSS and SVG, no scripts, nothing fetched).

Sections: a summary of each timeline, a timeline overview strip, time by op kind and by layer,
engine utilisation, the critical path (when the graph is given), the top ops, and, when a measured
timeline is present, comparison tables of every other timeline against it, then any extra
:class:`~opgraph.export.ReportTable` the caller passes (a compare engine's detailed tables).
The numbers come from :mod:`opgraph.export.stats`; the layout is ``templates/report.html.j2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opgraph.export import stats as st
from opgraph.export.common import ReportTable, check_timelines, kind_color
from opgraph.export.svg import column_chart, grouped_hbar_chart, hbar_chart, timeline_overview
from opgraph.ir import OpGraph, Timeline, TimelineKind, atomic_write

SERIES_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#8172B3", "#C44E52", "#937860")
"""Colour of each timeline in charts that put several side by side."""

TEMPLATE = "report.html.j2"


def _fmt_cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def report_context(
    *,
    timelines: Sequence[Timeline],
    graph: OpGraph | None = None,
    tables: Sequence[ReportTable] = (),
    title: str = "opgraph report",
) -> dict[str, Any]:
    """Everything the report template shows, as plain values and inline SVG strings."""
    from opgraph import __version__

    check_timelines(timelines, "HTML report")
    for i, t in enumerate(tables):
        if not isinstance(t, ReportTable):
            raise TypeError(f"tables[{i}] is a {type(t).__name__}, not a ReportTable")
    sums = [st.summarize(tl, i, graph) for i, tl in enumerate(timelines)]
    t0 = min(tl.start_us for tl in timelines)
    t1 = max(tl.end_us for tl in timelines)
    overviews = [timeline_overview(tl, graph=graph, start_us=t0, end_us=t1) for tl in timelines]
    legend = sorted({r.key for s in sums for r in s.by_kind})

    # Time by kind: one chart, grouped when there are several timelines.
    kinds = list(dict.fromkeys(r.key for s in sums for r in s.by_kind))
    by_kind = [{r.key: r for r in s.by_kind} for s in sums]
    if len(sums) == 1:
        kind_chart = hbar_chart(
            [(r.key, r.total_us, kind_color(r.key)) for r in sums[0].by_kind], fmt=st.fmt_us, label="time by op kind"
        )
    else:
        kind_chart = grouped_hbar_chart(
            kinds,
            [
                (s.label, [by_kind[i][k].total_us if k in by_kind[i] else 0.0 for k in kinds], _series(i))
                for i, s in enumerate(sums)
            ],
            fmt=st.fmt_us,
            label="time by op kind per timeline",
        )
    kind_rows = [[k, *[(by_kind[i].get(k)) for i in range(len(sums))]] for k in kinds]

    layers = [k for k in dict.fromkeys(r.key for s in sums for r in s.by_layer)]
    # rows are in layer order already ("prefill L0".., "decode L0".., "other"); keep it, "other" last
    layers.sort(key=lambda k: k == "other")
    by_layer = [{r.key: r for r in s.by_layer} for s in sums]
    has_layers = any(k != "other" for k in layers)
    layer_charts = [
        column_chart(
            [(r.key, r.total_us) for r in s.by_layer],
            fmt=st.fmt_us,
            label=f"time by layer, {s.label}",
            color=_series(i),
        )
        for i, s in enumerate(sums)
    ]
    layer_rows = [[k, *[by_layer[i].get(k) for i in range(len(sums))]] for k in layers]

    util_charts = [
        hbar_chart(
            [(r.track, r.utilisation, _series(i)) for r in s.track_rows],
            fmt=st.fmt_pct,
            label=f"utilisation, {s.label}",
            max_value=1.0,
        )
        for i, s in enumerate(sums)
    ]

    cp = st.critical_path_summary(graph, timelines) if graph is not None else None
    cp_chart = (
        hbar_chart([(r.key, r.total_us, kind_color(r.key)) for r in cp.by_kind], fmt=st.fmt_us, label="critical path")
        if cp is not None and cp.by_kind
        else ""
    )

    step_tables = [
        ReportTable(
            title=f"{title_} (device time)",
            columns=(head, *[x.label for x in sums]),
            rows=tuple(
                (k, *[st.fmt_us(rows[i][k].total_us) if k in rows[i] else "-" for i in range(len(sums))]) for k in keys
            ),
            numeric=(False, *[True] * len(sums)),
            note=note,
        )
        for title_, head, attr, note in (
            ("By step", "step", "by_step", "each forward pass; a measured trace's passes come from its analysis"),
            ("By stage", "stage", "by_stage", "prefill and decode device time (all steps of a stage summed)"),
        )
        for rows in [[{r.key: r for r in getattr(x, attr)} for x in sums]]
        for keys in [list(dict.fromkeys(r.key for x in sums for r in getattr(x, attr)))]
        if any(len(getattr(x, attr)) > 1 for x in sums)
    ]

    comparisons: list[ReportTable] = []
    measured = [i for i, tl in enumerate(timelines) if tl.source.kind is TimelineKind.MEASURED]
    if measured:
        m = measured[0]
        for i, tl in enumerate(timelines):
            if i != m:
                comparisons.extend(
                    st.comparison_tables(timelines[m], tl, graph=graph, labels=(sums[m].label, sums[i].label))
                )

    return {
        "title": title,
        "version": __version__,
        "graph": graph.metadata if graph is not None else None,
        "graph_ops": len(graph.ops) if graph is not None else 0,
        "summaries": sums,
        "series_colors": [_series(i) for i in range(len(sums))],
        "overviews": overviews,
        "legend": [(k, kind_color(k)) for k in legend],
        "kind_colors": {k: kind_color(k) for k in kinds},
        "kind_chart": kind_chart,
        "kind_rows": kind_rows,
        "has_layers": has_layers,
        "layer_charts": layer_charts,
        "layer_rows": layer_rows,
        "util_charts": util_charts,
        "critical_path": cp,
        "cp_chart": cp_chart,
        "comparisons": comparisons,
        "tables": step_tables + list(tables),
    }


def _series(i: int) -> str:
    return SERIES_COLORS[i % len(SERIES_COLORS)]


def render_html_report(
    *,
    timelines: Sequence[Timeline],
    graph: OpGraph | None = None,
    tables: Sequence[ReportTable] = (),
    title: str = "opgraph report",
) -> str:
    """The report as an HTML string."""
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["us"] = st.fmt_us
    env.filters["pct"] = st.fmt_pct
    env.filters["count"] = st.fmt_count
    env.filters["cell"] = _fmt_cell
    env.filters["svg"] = Markup  # our own SVG, escaped when built
    ctx = report_context(timelines=timelines, graph=graph, tables=tables, title=title)
    return env.get_template(TEMPLATE).render(**ctx)


def write_html_report(
    path: str | Path,
    *,
    timelines: Sequence[Timeline],
    graph: OpGraph | None = None,
    tables: Sequence[ReportTable] = (),
    title: str = "opgraph report",
) -> Path:
    """Write the self-contained HTML report of ``timelines`` to ``path`` (atomically) and return the path.

    ``graph`` adds the critical path, FLOPs and bytes; ``tables`` are extra titled tables shown at
    the end (for example a comparison from ``opgraph compare``).
    """
    path = Path(path)
    html = render_html_report(timelines=timelines, graph=graph, tables=tables, title=title)
    with atomic_write(path) as out:
        out.write(html.encode())
    return path
