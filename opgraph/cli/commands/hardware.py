"""``opgraph hardware list`` and ``opgraph hardware show NAME|FILE``: the device catalog."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich import box

from opgraph.cli.common import console, handle_errors, new_table, print_notes
from opgraph.fmt import fmt_bytes, fmt_count

if TYPE_CHECKING:
    from hardware import HardwareSpec

hardware_app = typer.Typer(
    help="The hardware catalog: list devices, show one (or your own .toml file).",
    no_args_is_help=True,
    add_completion=False,
)


def register(app: typer.Typer) -> None:
    """Add ``hardware`` with its subcommands to the app."""
    app.add_typer(hardware_app, name="hardware")


def _tflops(value: float | None) -> str:
    return "-" if not value else f"{value / 1e12:g}"


def _rate(value: float, unit: str) -> str:
    return fmt_count(value, unit) if value else "-"


@hardware_app.command("list")
@handle_errors
def list_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print every spec as JSON instead of a table."),
) -> None:
    """List the devices of the built-in catalog with their headline numbers (dense peaks)."""
    from hardware import list_hardware

    specs = list_hardware()
    if as_json:
        typer.echo(json.dumps([s.model_dump(mode="json") for s in specs], indent=2))
        return
    table = new_table(title=None, box=box.SIMPLE_HEAD)
    table.add_column("name", no_wrap=True)
    table.add_column("bf16", justify="right")
    table.add_column("fp8", justify="right")
    table.add_column("memory", justify="right", no_wrap=True)
    table.add_column("TB/s", justify="right")
    table.add_column("L2 MB", justify="right")
    table.add_column("SMs", justify="right")
    table.add_column("alias", no_wrap=True)
    for s in specs:
        table.add_row(
            s.name,
            f"{(s.tensor.bf16 or s.vector.bf16 or 0) / 1e12:.0f}",
            f"{s.tensor.fp8 / 1e12:.0f}" if s.tensor.fp8 else "-",
            fmt_bytes(s.memory_bytes),
            f"{s.memory_bandwidth / 1e12:.3g}",
            f"{s.l2_bytes / 1e6:.4g}",
            str(s.sm_count),
            s.aliases[0] if s.aliases else "",
        )
    console.print(table)
    console.print("bf16, fp8: dense tensor peaks in TFLOP/s; TB/s: memory bandwidth; L2 MB: last-level cache.")
    console.print("Show one with `opgraph hardware show NAME`; add your own with a .toml file (see `show --help`).")


def _show(spec: HardwareSpec) -> None:
    from opgraph.ir import DType

    console.print(f"[bold]{spec.name}[/bold]  {spec.description}  ({spec.vendor or '-'}, {spec.kind.value})")
    if spec.aliases:
        console.print(f"aliases: {', '.join(spec.aliases)}")
    table = new_table(title=None, show_header=True)
    table.add_column("peak (dense)")
    dtypes = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")
    for name in dtypes:
        table.add_column(name, justify="right")
    table.add_row("tensor TFLOP/s", *(_tflops(getattr(spec.tensor, d)) for d in dtypes))
    table.add_row("vector TFLOP/s", *(_tflops(getattr(spec.vector, d)) for d in dtypes))
    console.print(table)
    ic = spec.interconnect
    rows = [
        ("memory", fmt_bytes(spec.memory_bytes)),
        ("memory bandwidth", _rate(spec.memory_bandwidth, "B/s")),
        ("L2 / last-level cache", f"{spec.l2_bytes / 1e6:.4g} MB"),
        ("SMs / CUs / cores", str(spec.sm_count)),
        ("ridge point (bf16)", f"{spec.ridge_point(DType.bf16):.0f} FLOP/byte"),
        ("kernel launch latency", f"{spec.launch_latency_us:g} us"),
        ("host overhead per op", f"eager {spec.host.eager_us:g} us, CUDA graph {spec.host.cuda_graph_us:g} us"),
        (
            "device link",
            f"{ic.name or '-'}: {_rate(ic.bandwidth, 'B/s')} per direction, {ic.latency_us:g} us"
            if ic.bandwidth
            else "none",
        ),
        ("host link", f"{_rate(ic.pcie_bandwidth, 'B/s')} per direction, {ic.pcie_latency_us:g} us"),
    ]
    for key, value in rows:
        console.print(f"{key + ':':24s}{value}")
    print_notes(spec.notes)
    for source in spec.sources:
        console.print(f"source: {source}")


@hardware_app.command("show")
@handle_errors
def show_cmd(
    name: str = typer.Argument(
        ...,
        metavar="NAME|FILE",
        help=(
            "A catalog name or alias (h100, mi300x), or a .toml/.json file: the fields of a spec, rates "
            "with units ('3.35 TB/s'), or base = 'h100' plus the fields to change."
        ),
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the full spec as JSON."),
) -> None:
    """Show one device: peaks per dtype, memory, caches, launch and host costs, links, sources."""
    from hardware import load_hardware

    spec = load_hardware(name)
    if as_json:
        typer.echo(json.dumps(spec.model_dump(mode="json"), indent=2))
        return
    _show(spec)
