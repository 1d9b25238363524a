"""Find the best number of compute engines for one decoder layer on a hypothetical accelerator.

Scenario: the study of the seed project ("Visualizing Transformer Layer Operations"). One decoder
layer of Llama-3.2-1B decodes one token over a KV cache of 256 tokens; op times come from the
seed's size-based formula (the ``formula`` cost model), scaled from the H100 the constants
describe to an accelerator that exists only in this script; an ideal host issues every op at time
zero, and the earliest-available-engine policy of the seed's ``ComputeScheduler`` places ready
ops. Its engines are independent compute units, each with the accelerator's whole peak
(``independent_engines``), as the seed assumed; on a real GPU engines are streams that share one
device. Sweeping 1 to 6 engines shows where extra engines stop paying: the widest step of the layer
is the q, k and v projections, so the seed's answer, 3 engines, comes out again.

Run it as ``python examples/best_engine_count.py``.
"""

from __future__ import annotations

from hardware import DeviceKind, FormulaModel, HardwareSpec, HostOverhead, PeakFlops
from opgraph.capture import capture
from opgraph.ir import OpGraph, parallelism_profile
from simulators import HostConfig, HostMode, SimulationConfig, cost_problem, sweep_engines

MODEL = "llama-3.2-1b"  # the seed's model (a shipped preset)
KV_LEN = 256  # tokens already in the KV cache (the seed's --seq_len)
LAYER = 0  # the decoder layer studied
ENGINE_COUNTS = range(1, 7)  # compute engines to try
TOLERANCE = 0.01  # counts within 1% of the best makespan are as good as the best
REFERENCE = "h100"  # the device the formula's constants describe

ACCELERATOR = HardwareSpec(
    name="npu-x1",
    vendor="hypothetical",
    kind=DeviceKind.ACCELERATOR,
    description="A hypothetical inference accelerator",
    tensor=PeakFlops(bf16=400e12),  # FLOP/s on its matrix units
    vector=PeakFlops(bf16=50e12, fp32=25e12),  # FLOP/s on its vector units
    memory_bytes=64 * 2**30,  # bytes
    memory_bandwidth=2.0e12,  # bytes/s
    launch_latency_us=1.0,  # us per kernel
    host=HostOverhead(eager_us=0.0, cuda_graph_us=0.0),  # us per op: the study ignores the host
)


def decoder_layer(graph: OpGraph, layer: int) -> OpGraph:
    """The ops of one decoder layer and the dependencies among them."""
    ops = tuple(op for op in graph.ops if op.layer == layer)
    ids = {op.id for op in ops}
    edges = tuple(e for e in graph.edges if e.src in ids and e.dst in ids)
    return OpGraph(metadata=graph.metadata, ops=ops, edges=edges)


def main() -> None:
    """Capture the layer, sweep the engine count, print the makespans and the recommendation."""
    layer = decoder_layer(capture(MODEL, phase="decode", kv_len=KV_LEN, layers=LAYER + 1), LAYER)
    print(f"{MODEL} decoder layer {LAYER}, decode over {KV_LEN} cached tokens: {len(layer.ops)} ops")
    for op in layer.ops:
        print(f"  {op.id:>3} {op.kind.value:<11} {op.definition}")
    print(f"ops that could run at once, step by step: {parallelism_profile(layer)}")

    model = FormulaModel(reference=REFERENCE)
    problem, _, _ = cost_problem(layer, model, ACCELERATOR)
    config = SimulationConfig.standard(
        1, policy="earliest", host=HostConfig(mode=HostMode.NONE), independent_engines=True
    )
    sweep, _ = sweep_engines(problem, config, ENGINE_COUNTS, tolerance=TOLERANCE, hardware_name=ACCELERATOR.name)

    print()
    print(f"{ACCELERATOR.name} ({ACCELERATOR.description}), formula cost model scaled from {REFERENCE}")
    print(f"{'engines':>7} {'makespan us':>12} {'speedup':>8} {'utilisation':>12}")
    for p in sweep.points:
        mark = "  <- best" if p.engines == sweep.recommended else ""
        print(f"{p.engines:>7} {p.makespan_us:12.1f} {p.speedup:7.2f}x {p.utilization:11.0%}{mark}")
    print(f"critical path {sweep.critical_path_us:.1f} us: the makespan no engine count can beat")
    print(f"best engine count: {sweep.recommended} (the smallest within {TOLERANCE:.0%} of the best makespan)")


if __name__ == "__main__":
    main()
