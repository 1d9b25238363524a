"""``opgraph export TIMELINE... -o FILE``: Perfetto/Chrome trace JSON, Gantt PNG or HTML report."""

from __future__ import annotations

import webbrowser
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opgraph.cli.common import check_output_path, command, console, err_console

if TYPE_CHECKING:
    from opgraph.ir import Timeline


class ExportFormat(str, Enum):
    """What ``opgraph export`` writes."""

    PERFETTO = "perfetto"
    PNG = "png"
    HTML = "html"


_SUFFIXES = {".json": ExportFormat.PERFETTO, ".gz": ExportFormat.PERFETTO, ".png": ExportFormat.PNG}
_SUFFIXES.update({".html": ExportFormat.HTML, ".htm": ExportFormat.HTML})


def _format_for(output: Path, given: ExportFormat | None) -> ExportFormat:
    from opgraph.export import ExportError

    if given is not None:
        return given
    fmt = _SUFFIXES.get(output.suffix.lower())
    if fmt is None:
        raise ExportError(
            "cannot tell the format from the file name",
            where=str(output),
            hint="name it .json/.json.gz, .png or .html, or pass --format",
        )
    return fmt


def _load_timelines(paths: list[Path]) -> list[Timeline]:
    """Saved timelines or profiler traces, each told from its start and read once (a trace streamed)."""
    from opgraph.compare.loading import load_any_timeline

    return [load_any_timeline(p) for p in paths]


def _check_graph_model(model: str, tls: list[Timeline], paths: list[Path], graph_path: Path | None) -> None:
    """A timeline whose spans refer to another model's graph (its ``graph_model``) is an error: --graph
    would label its spans with the wrong ops."""
    from opgraph.export import ExportError

    for t, p in zip(tls, paths, strict=True):
        other = t.source.graph_model
        if model and other and other != model:
            raise ExportError(
                f"the timeline's ops are of model {other!r}, the graph {graph_path} is of {model!r}",
                where=str(p),
                hint="give the graph the timeline was simulated or measured from, or leave --graph out",
            )


@command("export")
def export(
    timelines: list[Path] = typer.Argument(
        ...,
        metavar="TIMELINE...",
        help="Timelines saved by opgraph (.json or .json.gz): simulated, measured, replayed; or profiler traces.",
    ),
    output: Path = typer.Option(..., "--output", "-o", help="File to write (.json, .json.gz, .png or .html)."),
    fmt: ExportFormat | None = typer.Option(
        None, "--format", "-f", help="perfetto, png or html; default: from the output's suffix."
    ),
    graph_path: Path | None = typer.Option(
        None, "--graph", "-g", help="The graph the spans refer to: adds shapes, FLOPs, bytes, the critical path."
    ),
    flows: bool = typer.Option(
        False, "--flows", help="Perfetto: draw an arrow for every data dependency (needs --graph; off for big graphs)."
    ),
    title: str | None = typer.Option(None, "--title", help="Title of the PNG or the report."),
    open_it: bool = typer.Option(
        False,
        "--open",
        help="Perfetto: serve the file once on 127.0.0.1:PORT and open it in ui.perfetto.dev; png/html: open the file.",
    ),
    port: int = typer.Option(9001, "--port", help="Port for --open (ui.perfetto.dev fetches from 9001)."),
    timeout_s: float = typer.Option(
        120.0, "--timeout", help="Seconds --open waits for the browser to fetch the trace."
    ),
    counter_bins: int = typer.Option(200, "--counter-bins", help="Perfetto: time bins of the utilisation counters."),
) -> None:
    """Export timelines as a Perfetto/Chrome trace, a Gantt chart PNG or a self-contained HTML report.

    Several timelines go side by side: one process each in the trace, one panel each in the PNG,
    one column each in the report (with comparison tables when one of them is measured).
    """
    from opgraph.export import ExportError, open_in_perfetto, write_gantt, write_html_report, write_perfetto
    from opgraph.ir import load_graph

    kind = _format_for(output, fmt)
    if not 1 <= port <= 65535:
        raise ExportError(f"port {port} is out of range", where="--port", hint="give a port of 1 to 65535")
    if not 0 < timeout_s < float("inf"):
        raise ExportError(f"must be a positive number of seconds (got {timeout_s:g})", where="--timeout")
    if flows and kind is not ExportFormat.PERFETTO:
        raise ExportError("--flows only applies to --format perfetto", where="--flows")
    if flows and graph_path is None:
        raise ExportError("--flows needs the graph", where="--flows", hint="pass it with --graph GRAPH")
    check_output_path(output, "-o/--output", inputs=[*timelines, graph_path])
    tls = _load_timelines(timelines)
    graph = load_graph(graph_path) if graph_path is not None else None
    if graph is not None:
        _check_graph_model(graph.metadata.model, tls, timelines, graph_path)
    if kind is ExportFormat.PERFETTO:
        path = write_perfetto(tls, output, graph=graph, flows=flows, counter_bins=counter_bins)
    elif kind is ExportFormat.PNG:
        path = write_gantt(tls, output, title=title, graph=graph)
    else:
        path = write_html_report(output, timelines=tls, graph=graph, title=title or "opgraph report")
    spans = sum(len(t.spans) for t in tls)
    console.print(f"wrote {path} ({kind.value}, {len(tls)} timeline{'s' if len(tls) != 1 else ''}, {spans} spans)")
    if not open_it:
        return
    if kind is ExportFormat.PERFETTO:
        open_in_perfetto(path, port=port, timeout_s=timeout_s, notify=lambda m: err_console().print(m, markup=False))
    else:
        if webbrowser.open(path.resolve().as_uri()) is False:
            err_console().print(f"no web browser could be opened on this machine; the file is {path}", markup=False)
