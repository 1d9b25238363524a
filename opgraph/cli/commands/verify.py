"""``opgraph verify GRAPH --expect FAMILY``: operator coverage of a graph against its model family."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from opgraph.cli.common import command, fail


@command("verify")
def verify(
    graph_path: Path = typer.Argument(None, metavar="GRAPH", help="A graph saved by `opgraph capture`."),
    expect: str = typer.Option(
        "auto",
        "--expect",
        "-e",
        help="Model family (llama, qwen, qwen-moe, mixtral, gpt-oss, deepseek, gemma, bloom), "
        "a .toml expectation file, or auto (from the graph's architecture and model name).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="List definitions and unmatched operations."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    list_families: bool = typer.Option(False, "--list", help="List the built-in families and exit."),
) -> None:
    """Check that a graph contains the operators its model family requires.

    Exit status: 0 when every required operator is present, 1 when one is missing, 2 on bad input.
    """
    from opgraph.ir import load_graph
    from validators.coverage import (
        auto_expectation,
        available_families,
        format_report,
        load_expectation,
        verify_graph,
    )

    if list_families:
        for name in available_families():
            e = load_expectation(name)
            typer.echo(f"{name:<10} required: {', '.join(e.required)}; optional: {', '.join(e.optional) or '-'}")
        return
    if graph_path is None:
        raise fail("missing argument GRAPH (a graph saved by `opgraph capture`)")
    graph = load_graph(graph_path)
    auto = expect == "auto"
    expectation = auto_expectation(graph) if auto else load_expectation(expect)
    report = verify_graph(graph, expectation, source=str(graph_path), auto=auto)
    if as_json:
        payload = report.model_dump(mode="json")
        payload["ok"] = report.ok
        payload["missing_required"] = report.missing_required
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo(format_report(report, verbose=verbose), nl=False)
    if not report.ok:
        raise typer.Exit(1)
