"""Compare a simulated timeline with a timeline measured on an H100, op by op.

Scenario: Llama-3.2-1B cut to 2 decoder layers ran a prefill of 256 tokens on an NVIDIA H100
under ``opgraph capture --device cuda --profile``, which saved the captured graph and a measured
timeline whose kernels carry the op ids of that graph (both are in ``tests/data/h100/``). Here the
same graph is simulated on the H100 spec with the roofline cost model on one compute engine, and
the two timelines are joined by op id: the script prints the end-to-end error (device time, wall
time, median per-op error) and the error by op kind. The roofline is close on the large GEMMs and
optimistic on norms and RoPE, which eager PyTorch runs as several small unfused kernels each; the
measured wall time is far above its device time because the eager run was host-bound.

Run it as ``python examples/compare_measured.py`` from anywhere.
"""

from __future__ import annotations

from pathlib import Path

from hardware import load_hardware, resolve_cost_model
from opgraph.compare import JoinMode, compare_timelines, comparison_tables
from opgraph.ir import load_graph, load_timeline
from simulators import SimulationConfig, simulate

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "h100"
GRAPH = DATA / "llama-3.2-1b-l2-prefill256.graph.json.gz"  # captured on the H100 (2 layers, 256 tokens)
MEASURED = DATA / "llama-3.2-1b-l2-prefill256.h100.timeline.json.gz"  # its profiled kernels, by op id
HARDWARE = "h100"  # the spec the simulation uses
COST_MODEL = "roofline"
ENGINES = 1  # one stream, as the measured run used


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    """A fixed-width text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    print(title)
    for row in [columns, *rows]:
        cells = [f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        print("  " + "  ".join(cells).rstrip())
    print()


def main() -> None:
    """Simulate the measured graph and print the comparison."""
    graph = load_graph(GRAPH)
    measured = load_timeline(MEASURED)
    md = graph.metadata
    print(f"graph: {md.model} {md.phase}, {len(graph.ops)} ops, capture {dict(sorted(md.capture.items()))}")
    print(f"measured: {measured.source.device}, {len(measured.spans)} spans")

    result = simulate(
        graph, load_hardware(HARDWARE), resolve_cost_model(COST_MODEL), SimulationConfig.standard(ENGINES)
    )
    print(f"simulated: {result.hardware_name}, {result.cost_model_name}, {ENGINES} engine(s)")
    print()

    comparison = compare_timelines(result.timeline(), measured, join=JoinMode.OP_ID, graph=graph)
    for title, columns, rows in comparison_tables(comparison):
        if title.startswith("End to end") or title == "By kind":
            print_table(title, columns, rows)
    gpu = comparison.row("gpu_time").reference_us
    wall = comparison.row("wall_time").reference_us
    print(f"the measured device was busy {gpu / wall:.1%} of the wall time: the eager run was host-bound")
    # Kinds the graph has ops of (a reference-only row, such as a memcpy the graph does not model, has none).
    worst = max((g for g in comparison.by_kind if g.ops), key=lambda g: abs(g.rel_error))
    print(f"largest error by kind: {worst.group} ({worst.rel_error:+.1%} over {worst.ops} ops)")


if __name__ == "__main__":
    main()
