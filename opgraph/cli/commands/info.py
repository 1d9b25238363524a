"""``opgraph info GRAPH``: a summary of a saved graph."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from opgraph.cli.common import command, console, new_table
from opgraph.fmt import fmt_bytes, fmt_count


@command("info")
def info(
    graph_path: Path = typer.Argument(
        ..., metavar="GRAPH", help="A graph saved by `opgraph capture` (.json or .json.gz)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of a table."),
) -> None:
    """Summarise a graph: ops by kind, FLOPs, bytes, layers and stages."""
    from opgraph.ir import LoadError, load_graph

    try:
        graph = load_graph(graph_path)
    except LoadError:
        if _is_catalog(graph_path):
            raise LoadError(
                "is an ops catalog, not an OpGraph",
                where=str(graph_path),
                hint=f"list its operations with `opgraph ops show {graph_path}`; `opgraph info` takes a graph saved "
                "by `opgraph capture`",
            ) from None
        raise
    summary = graph.summary()
    if as_json:
        summary["metadata"] = graph.metadata.model_dump(mode="json")
        typer.echo(json.dumps(summary, indent=2))
        return
    md = graph.metadata
    console.print(f"[bold]{md.model or graph_path.name}[/bold]  {md.architecture}  phase={md.phase or '-'}")
    settings = ", ".join(f"{k}={v}" for k, v in md.capture.items())
    if settings:
        console.print(f"capture: {settings}")
    table = new_table(title=None, show_footer=True)
    by_kind = summary["by_kind"]
    assert isinstance(by_kind, dict)
    table.add_column("kind", footer="total")
    table.add_column("ops", justify="right", footer=str(summary["ops"]))
    table.add_column("FLOPs", justify="right", footer=fmt_count(float(summary["flops"])))  # type: ignore[arg-type]
    table.add_column("bytes", justify="right", footer=fmt_bytes(float(summary["bytes"])))  # type: ignore[arg-type]
    for kind, row in sorted(by_kind.items(), key=lambda kv: -kv[1]["flops"]):
        table.add_row(kind, str(row["ops"]), fmt_count(row["flops"]), fmt_bytes(row["bytes"]))
    console.print(table)
    stages = summary["stages"]
    assert isinstance(stages, dict)
    console.print(
        f"layers: {summary['layers']}   edges: {summary['edges']}   stages: "
        + ", ".join(f"{k}={v}" for k, v in sorted(stages.items()))
    )
    for note in md.assumptions:
        console.print(f"assumed: {note}")


def _is_catalog(path: Path) -> bool:
    """Whether ``path`` holds an ops catalog (``opgraph ops add``): its top-level keys are a catalog's."""
    from opgraph.catalog.models import Catalog
    from opgraph.ir import OpgraphError
    from opgraph.ir.io import read_json_bytes

    try:
        raw = json.loads(read_json_bytes(path))
    except (OpgraphError, ValueError):
        return False
    if not isinstance(raw, dict):
        return False
    keys = set(raw)
    return {"hash_version", "entries"} <= keys and keys <= set(Catalog.model_fields)
