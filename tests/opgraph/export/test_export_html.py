"""HTML report: the numbers it shows, self-containment, escaping, extra tables, and the stats behind it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from export_fixtures import graph, measured, plain, simulated

from opgraph.export import ExportError, ReportTable, report_context, write_html_report
from opgraph.export.stats import comparison_tables, critical_path_summary, fmt_us, summarize, time_by_kind
from opgraph.ir import Span, Timeline, TimelineKind, TimelineSource, critical_path


def test_report_shows_the_numbers(tmp_path: Path) -> None:
    g = graph()
    sim, meas = simulated(g), measured(g)
    html = write_html_report(tmp_path / "r.html", timelines=[sim, meas], graph=g, title="Demo <report>").read_text()
    assert "<title>Demo &lt;report&gt;</title>" in html
    for tl in (sim, meas):
        assert f'data-metric="makespan">{fmt_us(tl.makespan_us)}<' in html
    for section in ("summary", "overview", "kinds", "layers", "utilisation", "critical-path", "top-ops", "comparison"):
        assert f'<section id="{section}">' in html, section
    dev = [s for s in sim.spans if s.category != "host"]
    gemm_us = sum(s.dur_us for s in dev if s.kind is not None and s.kind.value == "gemm")
    assert f">{fmt_us(gemm_us)}<" in html
    assert "<svg" in html and "By op kind: simulated" in html


def test_self_contained(tmp_path: Path) -> None:
    g = graph()
    html = write_html_report(tmp_path / "r.html", timelines=[simulated(g)], graph=g).read_text()
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html, re.I)
    assert "@import" not in html and "url(" not in html
    assert '<section id="comparison">' not in html  # nothing measured to compare with


def test_names_are_escaped(tmp_path: Path) -> None:
    tl = plain([("<script>alert(1)</script>", "<b>track</b>", 0, 5)])
    html = write_html_report(tmp_path / "r.html", timelines=[tl]).read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>track</b>" not in html


def test_extra_tables(tmp_path: Path) -> None:
    t = ReportTable(title="Calibration", columns=("kind", "error"), rows=(("gemm", 0.123456), ("norm", None)))
    assert t.numeric == (False, True)
    html = write_html_report(tmp_path / "r.html", timelines=[plain([("a", "e", 0, 1)])], tables=[t]).read_text()
    assert '<section id="tables">' in html and "<h3>Calibration</h3>" in html and ">0.1235<" in html
    with pytest.raises(ValueError, match="row 0 has 1 values"):
        ReportTable(title="x", columns=("a", "b"), rows=(("only",),))
    with pytest.raises(TypeError, match="not a ReportTable"):
        report_context(timelines=[plain([("a", "e", 0, 1)])], tables=["x"])  # type: ignore[list-item]
    with pytest.raises(ExportError):
        write_html_report(tmp_path / "empty.html", timelines=[])


def test_summary_numbers() -> None:
    tl = Timeline(
        source=TimelineSource(kind=TimelineKind.SIMULATED, name="s"),
        spans=(
            Span(name="h", track="host", start_us=0, dur_us=1, category="host"),
            Span(name="a", track="e0", start_us=0, dur_us=4, layer=0),
            Span(name="a", track="e1", start_us=2, dur_us=4, layer=1),
            Span(name="b", track="e0", start_us=4, dur_us=6),
        ),
    )
    s = summarize(tl)
    assert s.makespan_us == 10 and s.device_time_us == 14 and s.device_spans == 3
    assert [(r.key, r.total_us) for r in s.by_layer] == [("L0", 4), ("L1", 4), ("other", 6)]
    assert [(r.track, r.busy_us, r.host) for r in s.track_rows] == [
        ("host", 1, True),
        ("e0", 10, False),
        ("e1", 4, False),
    ]
    assert [(o.name, o.spans, o.total_us, o.max_us) for o in s.top_ops] == [("a", 2, 8, 4), ("b", 1, 6, 6)]
    assert sum(r.share for r in time_by_kind(tl.spans)) == pytest.approx(1.0)


def test_critical_path_summary_matches_ir_algorithm() -> None:
    g = graph()
    sim = simulated(g)
    cp = critical_path_summary(g, [measured(g), sim])
    assert cp is not None and cp.timeline_label.startswith("simulated")
    dur: dict[int, float] = {}
    for s in sim.spans:
        if s.category != "host" and s.op_id is not None:
            dur[s.op_id] = dur.get(s.op_id, 0.0) + s.dur_us
    want = critical_path(g, dur)
    assert cp.length_us == pytest.approx(want.length) and cp.ops == len(want.ops)
    assert cp.length_us <= sim.makespan_us + 1e-9
    assert sum(r.total_us for r in cp.by_kind) == pytest.approx(cp.length_us)
    assert critical_path_summary(g, [plain([("a", "e", 0, 1)])]) is None


def test_comparison_tables() -> None:
    m = plain([("g", "s", 0, 10), ("n", "s", 10, 10)], kind=TimelineKind.MEASURED, name="m")
    p = plain([("g", "s", 0, 5), ("n", "s", 5, 20)], name="p")
    tables = comparison_tables(m, p)
    end = dict((r[0], r[1:]) for r in tables[0].rows)
    assert end["makespan"] == ("20.00 us", "25.00 us", "+25.0%")
    assert [t.title.split(":")[0] for t in tables] == ["End to end", "By op kind", "By layer"]


def test_comparison_tables_join_ops_by_id() -> None:
    def tl(kind: TimelineKind, durs: dict[int, list[float]]) -> Timeline:
        spans, t = [], 0.0
        for op_id, parts in durs.items():
            for d in parts:
                spans.append(
                    Span(name=f"k{op_id}", track="s", start_us=t, dur_us=d, op_id=op_id, definition=f"{op_id}")
                )
                t += d
        spans.append(Span(name="launch", track="cpu", start_us=0, dur_us=50, op_id=1, category="runtime"))
        return Timeline(source=TimelineSource(kind=kind, name=kind.value), spans=tuple(spans))

    # op 1 ran as two kernels; op 3 was not measured; the runtime call is no device time of op 1
    measured_tl = tl(TimelineKind.MEASURED, {1: [4.0, 6.0], 2: [10.0]})
    predicted_tl = tl(TimelineKind.SIMULATED, {1: [12.0], 2: [9.0], 3: [1.0]})
    per_op = comparison_tables(measured_tl, predicted_tl)[-1]
    assert per_op.title == "Largest per-op errors (2 ops joined by op id)"
    assert per_op.rows == ((1, "1", "10.00 us", "12.00 us", "+20.0%"), (2, "2", "10.00 us", "9.00 us", "-10.0%"))
