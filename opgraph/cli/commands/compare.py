"""``opgraph compare PREDICTED REFERENCE``: error per op, kind, layer, stage and end to end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opgraph.cli.common import check_distinct_outputs, check_output_path, command, console, new_table

if TYPE_CHECKING:
    from opgraph.ir import Timeline


def _comparable(timeline: Timeline, path: Path, side: str, notes: list[str]) -> Timeline:
    """``timeline`` as compare reads it: a CPU profile's CPU ops as its device work (as ``validate`` does);
    a timeline with nothing to compare is a one-line error naming ``path``."""
    from opgraph.compare import CPU_PROFILE_NOTE, cpu_device_view
    from opgraph.compare.compare import is_cpu_profile, no_device_spans

    if timeline.device_spans():
        return timeline
    if is_cpu_profile(timeline):
        notes.append(f"{side} {path.name}: {CPU_PROFILE_NOTE}")
        return cpu_device_view(timeline)
    raise no_device_spans(timeline, side, where=str(path))


@command("compare")
def compare(
    predicted: Path = typer.Argument(
        ..., help="Predicted timeline (e.g. from `opgraph simulate`), or a profiler trace."
    ),
    reference: Path = typer.Argument(..., help="Reference timeline (measured or replayed), or a profiler trace."),
    graph: Path | None = typer.Option(None, "--graph", "-g", help="The graph both come from: fills kinds and layers."),
    join: str = typer.Option("auto", "--join", help="How to match spans: auto, op_id, definition."),
    top: int = typer.Option(10, "--top", min=1, help="Ops listed among those that explain most of the gap."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the full comparison as JSON."),
    html_out: Path | None = typer.Option(None, "--html", help="Write an HTML report with both timelines."),
    perfetto_out: Path | None = typer.Option(None, "--perfetto", help="Write both timelines side by side (Perfetto)."),
    allow_different_models: bool = typer.Option(False, "--allow-different-models", help="Compare across models."),
    rank: int | None = typer.Option(
        None,
        "--rank",
        min=0,
        help="Rank to detail (and to draw) when either side has several: rank r of a --tp N simulation "
        "against one rank's trace. Default: the first rank; ranks are never summed.",
    ),
) -> None:
    """Compare a predicted timeline with a reference one, op by op and end to end."""
    from opgraph.compare import JoinMode, compare_timelines, comparison_tables
    from opgraph.compare.loading import load_any_timeline
    from opgraph.ir import OpgraphError, load_graph, save_model

    try:
        mode = JoinMode(join)
    except ValueError:
        raise OpgraphError(f"unknown join {join!r}", where="--join", hint="use auto, op_id or definition") from None
    inputs = [predicted, reference, graph]
    check_output_path(json_out, "--json", inputs=inputs)
    check_output_path(html_out, "--html", inputs=inputs)
    check_output_path(perfetto_out, "--perfetto", inputs=inputs)
    check_distinct_outputs([(json_out, "--json"), (html_out, "--html"), (perfetto_out, "--perfetto")])
    notes: list[str] = []
    pred = _comparable(load_any_timeline(predicted), predicted, "predicted", notes)
    ref = _comparable(load_any_timeline(reference), reference, "reference", notes)
    g = load_graph(graph) if graph else None
    result = compare_timelines(
        pred, ref, join=mode, graph=g, top=top, allow_different_models=allow_different_models, rank=rank
    )
    if notes:
        result = result.model_copy(update={"notes": (*notes, *result.notes)})
    tables = comparison_tables(result)
    if result.rank is not None:
        # draw the rank compared, side by side, not all simulated ranks against one measured rank
        from opgraph.compare.ranks import rank_view, ranks_of

        pred = rank_view(pred, result.rank) if ranks_of(pred) else pred
        ref = rank_view(ref, result.rank) if ranks_of(ref) else ref
    written: list[Path] = []  # files first: a reader that stops early (`| head`) must not cost them
    if json_out:
        save_model(result, json_out)
        written.append(json_out)
    if perfetto_out or html_out:
        from opgraph.export import ReportTable, write_html_report, write_perfetto

        if perfetto_out:
            write_perfetto([pred, ref], perfetto_out, graph=g)
            written.append(perfetto_out)
        if html_out:
            # a trace comparison's tables are rebuilt by the report itself (measured vs simulated)
            report_tables = (
                [] if result.join is JoinMode.TRACE else [ReportTable(title=t, columns=c, rows=r) for t, c, r in tables]
            )
            write_html_report(
                html_out,
                timelines=[pred, ref],
                graph=g,
                tables=report_tables,
                title=f"{result.predicted} vs {result.reference}",
            )
            written.append(html_out)
    for title, columns, rows in tables:
        table = new_table(title=title, title_justify="left")
        for i, col in enumerate(columns):
            table.add_column(col, justify="left" if i == 0 or col in ("definition", "kind", "op") else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    if result.unmatched_predicted or result.unmatched_reference:
        console.print(
            f"unmatched: {result.unmatched_predicted} predicted ({result.unmatched_predicted_us:,.1f} us), "
            f"{result.unmatched_reference} reference ({result.unmatched_reference_us:,.1f} us)"
        )
    for path in written:
        console.print(f"wrote {path}")
