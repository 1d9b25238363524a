"""Capture Llama-3.1-8B and simulate it on an H100 with 1, 2 and 3 compute engines.

Scenario: how much of a prefill could run concurrently if the device overlapped independent ops
(q/k/v projections, gate/up projections) on several compute engines, as streams do? The engines
share the one H100: ops running at once split its peak FLOP/s and memory bandwidth, so overlap
pays only where a compute-bound op meets a memory-bound one or where ops leave the peak unused
(``independent_engines=True`` would give each engine a whole H100). The model is
captured on the meta device from its shipped config: all 32 decoder layers, no weights, no GPU.
Op times come from the roofline cost model of an H100 SXM; the host issues ops as eager PyTorch
does. For each engine count the script prints the makespan, the speedup over one engine and how
busy the engines are, then where the time goes by op kind.

Run it as ``python examples/llama_8b_engines.py [TRACE.json]``; with a path it also writes the
three simulated timelines side by side as a Perfetto trace (open it at ui.perfetto.dev).
"""

from __future__ import annotations

import sys

from hardware import load_hardware, resolve_cost_model
from opgraph.capture import capture
from simulators import SimulationConfig, cost_problem, default_host_us, run_problem

MODEL = "llama-3.1-8b"  # a shipped preset (config only)
LAYERS = None  # all 32 decoder layers; an int cuts the model to its first N (faster capture)
BATCH = 1  # sequences
SEQ_LEN = 1024  # prompt tokens per sequence
HARDWARE = "h100"  # catalog name (H100 SXM: 989 TFLOP/s bf16, 3.35 TB/s)
COST_MODEL = "roofline"
ENGINE_COUNTS = (1, 2, 3)  # compute engines per simulation


def main(trace_path: str | None = None) -> None:
    """Capture, simulate with each engine count, print the results (and optionally write a trace)."""
    graph = capture(MODEL, phase="prefill", batch=BATCH, seq_len=SEQ_LEN, layers=LAYERS)
    flops = sum(op.flops for op in graph.ops)
    moved = sum(op.bytes_read + op.bytes_written for op in graph.ops)
    print(f"{MODEL}: prefill of {BATCH} x {SEQ_LEN} tokens, {graph.metadata.num_layers} layers, {len(graph.ops)} ops")
    print(f"  {flops / 1e12:.2f} TFLOP, {moved / 1e9:.2f} GB moved")

    hw = load_hardware(HARDWARE)
    problem, model_name, unique = cost_problem(graph, resolve_cost_model(COST_MODEL), hw)
    print(f"{hw.name} ({hw.description}), cost model {model_name}: {unique} unique op configs costed")

    results = {}
    for engines in ENGINE_COUNTS:
        config = SimulationConfig.standard(engines)
        results[engines] = run_problem(
            problem, config, host_per_op_us=default_host_us(config, hw), hardware_name=hw.name
        )

    print()
    print(f"{'engines':>7} {'makespan ms':>12} {'speedup':>8} {'utilisation':>12}")
    one = results[ENGINE_COUNTS[0]].makespan_us
    for engines, res in results.items():
        st = res.stats()
        busy = [e.utilization for e in st.engines if e.group == "compute"]
        print(f"{engines:>7} {st.makespan_us / 1e3:12.3f} {one / st.makespan_us:7.2f}x {sum(busy) / len(busy):11.0%}")
    cp = results[ENGINE_COUNTS[0]].stats().critical_path
    print(f"critical path {cp.length_us / 1e3:.3f} ms ({len(cp.ops)} ops): no engine count can beat it")

    print()
    print("time by op kind on 1 engine:")
    print(f"  {'kind':<12} {'ops':>5} {'ms':>9} {'share':>7}")
    for kind, row in results[ENGINE_COUNTS[0]].stats().by_kind.items():
        print(f"  {kind:<12} {row.ops:>5} {row.busy_us / 1e3:9.3f} {row.share:7.1%}")

    if trace_path:
        from opgraph.export import write_perfetto

        write_perfetto([r.timeline() for r in results.values()], trace_path, graph=graph)
        print(f"\nwrote {trace_path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
