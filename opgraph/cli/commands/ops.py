"""``opgraph ops``: build catalogs of traced op configs and query them.

``opgraph ops add CATALOG GRAPH...`` creates or extends a catalog; ``opgraph ops CATALOG [OP]``
(short for ``opgraph ops show``) lists operations, or the configs of one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

from opgraph.cli.common import check_output_path, console, handle_errors

if TYPE_CHECKING:
    from opgraph.catalog import Catalog, CatalogEntry
    from opgraph.ir import OpBase, TensorSpec


class _ShowByDefault(TyperGroup):
    """A group whose first word, when it is not a subcommand, is the CATALOG of ``show``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # click's or typer's vendored Context
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["show", *args]
        return super().parse_args(ctx, args)


ops_app = typer.Typer(
    cls=_ShowByDefault,
    no_args_is_help=True,
    add_completion=False,
    help=(
        "Catalogs of traced op configs. `opgraph ops add CATALOG GRAPH...` merges graphs; "
        "`opgraph ops CATALOG [OP]` lists operations or the configs of OP."
    ),
)


def register(app: typer.Typer) -> None:
    """Add ``ops`` (with ``add`` and ``show``) to the app."""
    app.add_typer(ops_app, name="ops")


@ops_app.command("add")
@handle_errors
def add(
    catalog_path: Path = typer.Argument(
        ..., metavar="CATALOG", help="Catalog file to create or extend (.json or .json.gz)."
    ),
    graphs: list[Path] = typer.Argument(..., metavar="GRAPH...", help="Graphs saved by `opgraph capture`."),
    hardware: str = typer.Option(
        None, "--hardware", help="Hardware name for the provenance, when the graphs do not record one."
    ),
    include_views: bool = typer.Option(False, "--include-views", help="Also catalog view ops (no kernel)."),
    force: bool = typer.Option(False, "--force", help="Count graphs again that the catalog already has."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the final summary line."),
) -> None:
    """Merge graphs into a catalog of deduplicated op configs, with provenance."""
    from opgraph.catalog import add_graph_files

    check_output_path(catalog_path, "CATALOG", inputs=graphs)
    existed = catalog_path.exists()
    catalog, results = add_graph_files(
        catalog_path, graphs, hardware=hardware, include_views=include_views, force=force
    )
    new_total = sum(r.new_configs for r in results)
    if not quiet:
        for path, r in zip(graphs, results, strict=True):
            if r.skipped:
                console.print(
                    f"  {path}: already in the catalog, skipped (use --force to count it again)", soft_wrap=True
                )
            else:
                console.print(
                    f"  {path}: {r.model}: {r.ops} ops, {r.configs} configs, {r.new_configs} new", soft_wrap=True
                )
    verb = "extended" if existed else "created"
    console.print(
        f"{verb} {catalog_path}: {len(catalog)} configs of {len(catalog.operations)} operations "
        f"from {len(catalog.graphs)} graphs ({new_total} new configs)",
        soft_wrap=True,
    )


@ops_app.command("show")
@handle_errors
def show(
    catalog_path: Path = typer.Argument(..., metavar="CATALOG", help="Catalog made by `opgraph ops add`."),
    op: str = typer.Argument(
        None, metavar="[OP]", help="Operation (gemm), kind (norm), definition (globs allowed) or config hash."
    ),
    model: str = typer.Option(None, "--model", "-m", help="Only configs seen in this model (glob allowed)."),
    phase: str = typer.Option(None, "--phase", help="Only configs seen in this phase or stage."),
    hardware: str = typer.Option(None, "--hardware", help="Only configs seen on this hardware."),
    limit: int = typer.Option(0, "--limit", "-n", min=0, help="Show at most this many rows (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the operations of a catalog with config and use counts, or the configs of OP."""
    from opgraph.catalog import filter_entries, load_catalog, select_op, summarize

    catalog = load_catalog(catalog_path)
    entries = filter_entries(catalog, model=model, phase=phase, hardware=hardware)
    if op is None:
        rows = summarize(entries)
        shown = rows[:limit] if limit else rows
        if as_json:
            payload = {
                "catalog": str(catalog_path),
                "graphs": len(catalog.graphs),
                "configs": len(entries),
                "uses": sum(e.uses for e in entries),
                "models": sorted({m for e in entries for m in e.models}),
                "operations": [r.model_dump(mode="json") for r in shown],
            }
            typer.echo(json.dumps(payload, indent=2))
            return
        _print_operations(catalog, catalog_path, entries, shown, len(rows))
        return
    hits = select_op(entries, op)
    shown_entries = hits[:limit] if limit else hits
    if as_json:
        typer.echo(
            json.dumps({"query": op, "configs": len(hits), "entries": [entry_json(e) for e in shown_entries]}, indent=2)
        )
        return
    _print_configs(op, shown_entries, len(hits))


def _models_text(models: tuple[str, ...] | list[str], width: int = 3) -> str:
    text = ", ".join(models[:width])
    return text + (f" +{len(models) - width}" if len(models) > width else "")


def _print_operations(
    catalog: Catalog, path: Path, entries: list[CatalogEntry], rows: list[Any], total_rows: int
) -> None:
    from opgraph.cli.common import new_table

    models = sorted({m for e in entries for m in e.models})
    console.print(
        f"[bold]{path}[/bold]: {len(entries)} configs of {total_rows} operations, "
        f"{sum(e.uses for e in entries)} uses, from {len(catalog.graphs)} graphs",
        soft_wrap=True,
    )
    if models:
        console.print(f"models: {', '.join(models)}")
    table = new_table()
    table.add_column("operation", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("configs", justify="right")
    table.add_column("uses", justify="right")
    table.add_column("definitions", justify="right")
    table.add_column("models")
    for r in rows:
        table.add_row(r.operation, r.kind, str(r.configs), str(r.uses), str(r.definitions), _models_text(r.models))
    console.print(table)
    if len(rows) < total_rows:
        console.print(f"({total_rows - len(rows)} more operations; raise --limit to see them)")


def _tensor_text(t: TensorSpec) -> str:
    from opgraph.catalog import tensor_layout

    shape = "x".join(str(d) for d in t.shape) or "scalar"
    layout = tensor_layout(t.shape, t.strides)
    suffix = "" if layout == "contiguous" else f" {layout}"
    return f"{shape} {t.dtype.value}{suffix}"


def call_text(op: OpBase) -> str:
    """The non-tensor call arguments of an op, compactly (``dim=-1, alpha=1``); empty when none."""
    if op.call is None:
        return ""
    parts: list[str] = []
    for a in op.call.args:
        if not _is_tensor_arg(a):
            parts.append(_value_text(a))
    for k, v in sorted(op.call.keywords.items()):
        parts.append(f"{k}={_value_text(v)}")
    return ", ".join(parts)


def _is_tensor_arg(value: object) -> bool:
    if isinstance(value, dict):
        return set(value) == {"tensor"}
    if isinstance(value, list) and value:
        return all(_is_tensor_arg(v) for v in value)
    return False


def _value_text(value: object) -> str:
    if isinstance(value, dict) and set(value) == {"dtype"}:
        return str(value["dtype"])
    if isinstance(value, dict) and set(value) == {"tensor"}:
        return f"T{value['tensor']}"
    if isinstance(value, list):
        return "[" + ",".join(_value_text(v) for v in value) + "]"
    return json.dumps(value)


def _print_configs(query: str, entries: list[CatalogEntry], total: int) -> None:
    from opgraph.catalog import dtype_signature, size_label
    from opgraph.cli.common import new_table

    ops = sorted({e.operation for e in entries})
    console.print(f"[bold]{query}[/bold]: {total} configs ({', '.join(ops)}), {sum(e.uses for e in entries)} uses")
    with_call = any(call_text(e.op) for e in entries)
    table = new_table()
    table.add_column("hash", no_wrap=True)
    table.add_column("definition", no_wrap=True)
    table.add_column("sizes", no_wrap=True)
    table.add_column("dtypes", no_wrap=True)
    table.add_column("inputs")
    if with_call:
        table.add_column("args")
    table.add_column("uses", justify="right")
    table.add_column("models")
    table.add_column("phases")
    for e in entries:
        row = [
            e.hash[:10],
            e.op.definition,
            size_label(e.op),
            dtype_signature(e.op),
            ", ".join(_tensor_text(t) for t in e.op.inputs) or "-",
        ]
        if with_call:
            row.append(call_text(e.op))
        row += [str(e.uses), _models_text(e.models), ",".join(e.phases) or "-"]
        table.add_row(*row)
    console.print(table)
    if len(entries) < total:
        console.print(f"({total - len(entries)} more configs; raise --limit to see them)")


def entry_json(e: CatalogEntry) -> dict[str, Any]:
    """One entry as the JSON ``opgraph ops CATALOG OP --json`` prints."""
    from opgraph.catalog import dtype_signature, size_label, tensor_layout

    def tensors(ts: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
        return [
            {
                "shape": list(t.shape),
                "dtype": t.dtype.value,
                "strides": list(t.strides) if t.strides is not None else None,
                "layout": tensor_layout(t.shape, t.strides),
            }
            for t in ts
        ]

    return {
        "hash": e.hash,
        "operation": e.operation,
        "kind": e.op.kind.value,
        "definition": e.op.definition,
        "target": e.op.target,
        "sizes": size_label(e.op),
        "dtypes": dtype_signature(e.op),
        "inputs": tensors(e.op.inputs),
        "outputs": tensors(e.op.outputs),
        "call": e.op.call.model_dump(mode="json") if e.op.call is not None else None,
        "uses": e.uses,
        "models": list(e.models),
        "phases": list(e.phases),
        "hardware": list(e.hardware),
        "sources": [s.model_dump(mode="json") for s in e.sources],
        "op": e.op.model_dump(mode="json"),
    }
