"""A user's own cost model in a few lines, used from the API (and from the CLI by its path).

Scenario: you measured that your GEMMs run at a flat 60% of the tensor peak (unless reading their
operands takes longer) and want to see what that does to one Llama-style decoder layer's prefill
on an H100, keeping the built-in roofline for everything else. A cost model is any class with
``estimate(op, hw) -> Cost``; nothing to inherit.

From the CLI the same class is found by its path::

    opgraph simulate graph.json --hardware h100 --cost-model examples/custom_cost_model.py:MyModel

Run this file to print the per-op costs of the layer under both models.
"""

from __future__ import annotations

from hardware import Bound, Cost, HardwareSpec, RooflineModel, cost_graph, load_hardware, resolve_cost_model
from opgraph.ir import Activation, Attention, Elementwise, Gemm, Norm, OpBase, OpGraph, View

GEMM_EFFICIENCY = 0.6  # fraction of the tensor peak (dimensionless)
MEMORY_EFFICIENCY = 0.85  # fraction of the memory bandwidth a GEMM's operands stream at
TOKENS = 2048  # prefill tokens (batch 1)
HIDDEN = 4096  # model width
INTERMEDIATE = 14336  # MLP width
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


class MyModel:
    """GEMMs at a flat fraction of peak (or their bytes, if slower) plus the launch; the rest from the roofline."""

    def __init__(self, gemm_efficiency: float = GEMM_EFFICIENCY) -> None:
        self.gemm_efficiency = float(gemm_efficiency)
        self.fallback = RooflineModel()

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        """The cost of ``op`` on ``hw``."""
        if isinstance(op, Gemm):
            compute_s = op.flops / (hw.peak_flops(op.dtype) * self.gemm_efficiency)
            memory_s = op.total_bytes / (hw.memory_bandwidth * MEMORY_EFFICIENCY)
            bound = Bound.COMPUTE if compute_s >= memory_s else Bound.MEMORY
            seconds = max(compute_s, memory_s) + hw.launch_latency_us * 1e-6
            return Cost(seconds, bound, compute_s=compute_s, memory_s=memory_s, efficiency=self.gemm_efficiency)
        return self.fallback.estimate(op, hw)


def decoder_layer() -> OpGraph:
    """One Llama-3-8B-like decoder layer, prefill, as a chain of typed ops."""
    qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    ops = [
        Norm(id=0, rows=TOKENS, hidden=HIDDEN),
        Gemm(id=1, m=TOKENS, n=qkv, k=HIDDEN),
        View(id=2, fn="view"),
        Attention(id=3, batch=1, q_len=TOKENS, kv_len=TOKENS, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM),
        Gemm(id=4, m=TOKENS, n=HIDDEN, k=HEADS * HEAD_DIM),
        Elementwise(id=5, fn="add", numel=TOKENS * HIDDEN, hidden=HIDDEN),
        Norm(id=6, rows=TOKENS, hidden=HIDDEN),
        Gemm(id=7, m=TOKENS, n=2 * INTERMEDIATE, k=HIDDEN),
        Activation(id=8, fn="silu", numel=TOKENS * INTERMEDIATE, hidden=INTERMEDIATE, gated=True),
        Gemm(id=9, m=TOKENS, n=HIDDEN, k=INTERMEDIATE),
        Elementwise(id=10, fn="add", numel=TOKENS * HIDDEN, hidden=HIDDEN),
    ]
    return OpGraph(ops=tuple(ops))


def main() -> None:
    """Cost the layer with the roofline and with MyModel (found by its path, as the CLI does)."""
    hw = load_hardware("h100")
    graph = decoder_layer()
    roofline = resolve_cost_model("roofline")
    mine = resolve_cost_model(f"{__file__}:MyModel", gemm_efficiency=GEMM_EFFICIENCY)
    base, custom = cost_graph(graph, roofline, hw), cost_graph(graph, mine, hw)
    print(f"{hw.name}: one decoder layer, prefill of {TOKENS} tokens")
    print(f"{'op':>3}  {'definition':42} {'roofline us':>12} {'MyModel us':>11}  bound")
    for op in graph.ops:
        a, b = base.costs[op.id], custom.costs[op.id]
        print(f"{op.id:>3}  {op.definition:42} {a.us:12.1f} {b.us:11.1f}  {b.bound.value}")
    print(f"{'':3}  {'total':42} {base.total_seconds * 1e6:12.1f} {custom.total_seconds * 1e6:11.1f}")


if __name__ == "__main__":
    main()
