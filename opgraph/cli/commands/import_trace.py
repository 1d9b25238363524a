"""``opgraph import TRACE -o timeline.json``: a torch-profiler trace as a measured opgraph Timeline."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from opgraph.cli.common import check_output_path, cli_notes, command, console, print_notes


@command("import")
def import_trace(
    trace: Path = typer.Argument(
        ..., metavar="TRACE", help="torch-profiler trace: .json, .json.gz, a folder of ranks, or a .tar.gz."
    ),
    output: Path = typer.Option(..., "-o", "--output", help="Timeline file to write (.json or .json.gz)."),
    kernels_only: bool = typer.Option(False, "--kernels-only", help="Leave out host spans (CPU ops, launches)."),
    rank: int | None = typer.Option(
        None,
        "--rank",
        min=0,
        help="Only this rank of a multi-rank trace; a rank the trace lacks is an error (a single-rank trace "
        "without distributedInfo is rank 0).",
    ),
    patterns: list[Path] = typer.Option([], "--patterns", help="Extra kernel pattern file (TOML) or folder."),
) -> None:
    """Import a trace into a measured Timeline (kernels typed and labelled by layer, stage and pass)."""
    from opgraph.ir import save_model
    from opgraph.trace import load_patterns, load_trace

    check_output_path(output, "-o/--output", inputs=[trace])
    tl = load_trace(trace, cpu=not kernels_only, rank=rank, patterns=load_patterns(list(patterns)))
    tl = tl.model_copy(update={"notes": cli_notes(tl.notes)})
    save_model(tl, output)
    incomplete = [n for n in tl.notes if "incomplete" in n]
    if incomplete:
        print(f"warning: {trace}: incomplete trace, events were skipped ({'; '.join(incomplete)})", file=sys.stderr)
    kernels = sum(1 for s in tl.spans if s.args.get("type") == "kernel")
    console.print(
        f"{output}: {len(tl.spans)} spans ({kernels} kernels) on {len(tl.tracks())} tracks, device "
        f"{tl.source.device or 'unknown'}"
    )
    print_notes(tl.notes)
