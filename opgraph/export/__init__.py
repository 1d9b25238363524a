"""Exporters and reports: Chrome/Perfetto trace JSON, Gantt PNG, self-contained HTML report, ``--open``.

Every exporter is a pure function of one or more :class:`~opgraph.ir.Timeline` (and optionally the
:class:`~opgraph.ir.OpGraph` the spans refer to) that writes one file atomically. matplotlib and
jinja2 are imported only when a PNG or a report is written.
"""

from opgraph.export.common import KIND_COLORS, ExportError, ReportTable, ServeTimeoutError, kind_color
from opgraph.export.gantt import write_gantt
from opgraph.export.html import render_html_report, report_context, write_html_report
from opgraph.export.perfetto import (
    trace_document,
    trace_events,
    trace_header,
    trace_time,
    write_perfetto,
)
from opgraph.export.serve import open_in_perfetto, perfetto_url

__all__ = [
    "KIND_COLORS",
    "ExportError",
    "ReportTable",
    "ServeTimeoutError",
    "kind_color",
    "open_in_perfetto",
    "perfetto_url",
    "render_html_report",
    "report_context",
    "trace_document",
    "trace_events",
    "trace_header",
    "trace_time",
    "write_gantt",
    "write_html_report",
    "write_perfetto",
]
