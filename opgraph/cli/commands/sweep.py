"""``opgraph sweep CATALOG --op OP -o tests/.../test_x.py``: write a sweep test module of traced configs."""

from __future__ import annotations

from pathlib import Path

import typer

from opgraph.cli.common import check_output_path, command, console


@command("sweep")
def sweep(
    catalog_path: Path = typer.Argument(..., metavar="CATALOG", help="Catalog made by `opgraph ops add`."),
    op: str = typer.Option(
        ..., "--op", help="Operation (gemm), kind (norm), definition (globs allowed) or config hash."
    ),
    out: Path = typer.Option(..., "--output", "-o", help="Test module to write (tests/.../test_<op>.py)."),
    all_cases: bool = typer.Option(
        False, "--all-cases", help="Product of the distinct shapes, dtypes and options, not just traced configs."
    ),
    model: str = typer.Option(None, "--model", "-m", help="Only configs seen in this model (glob allowed)."),
    phase: str = typer.Option(None, "--phase", help="Only configs seen in this phase or stage."),
    limit: int = typer.Option(None, "--limit", "-n", min=1, help="At most this many cases (most used first)."),
    device: str = typer.Option("cpu", "--device", help="Default replay device of the module: cpu, cuda or cuda:N."),
    embed: bool = typer.Option(
        False, "--embed", help="Write the cases into the module instead of reading the catalog at collection."
    ),
    max_cases: int = typer.Option(5000, "--max-cases", min=1, help="Refuse --all-cases products larger than this."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the case ids without writing."),
) -> None:
    """Write a pytest module that replays every config of OP from a catalog through the validators."""
    from validators.sweep import render_sweep_module, write_sweep_module

    kwargs: dict[str, object] = {
        "all_cases": all_cases,
        "model": model,
        "phase": phase,
        "limit": limit,
        "device": device,
        "embed": embed,
        "max_cases": max_cases,
    }
    if dry_run:
        _, cases = render_sweep_module(catalog_path, op, out, **kwargs)  # type: ignore[arg-type]
        for c in cases:
            typer.echo(f"{c.id}\t{c.uses}")
        return
    check_output_path(out, "-o/--output", inputs=[catalog_path])
    cases = write_sweep_module(catalog_path, op, out, **kwargs)
    traced = sum(1 for c in cases if c.traced)
    extra = f" ({traced} traced, {len(cases) - traced} combined)" if all_cases else ""
    console.print(f"wrote {out}: {len(cases)} cases of {op}{extra}; run: pytest {out}", soft_wrap=True)
