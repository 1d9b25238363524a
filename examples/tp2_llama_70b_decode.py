"""Simulate a tensor-parallel (TP=2) decode step of Llama-3.1-70B on two H100s, collectives included.

Scenario: Llama-3.1-70B does not fit one 80 GB H100 in bf16, so it is served with tensor
parallelism over two. The model is captured on the meta device (all 80 layers, no weights), then
sharded Megatron-style by ``opgraph.transforms.shard_tensor_parallel``: q/k/v and gate/up
projections split by output features, o_proj and down_proj by input features followed by an
all-reduce, a vocabulary-parallel embedding and lm_head. Each rank runs the sharded graph; the
simulator runs both ranks, and every all-reduce waits for both and costs an alpha-beta time over
the NVLink interconnect of the H100 spec. The script prints the makespan, the time in collectives
and their share, and the per-rank weight bytes that explain why TP=2 is needed at all.

Run it as ``python examples/tp2_llama_70b_decode.py``.
"""

from __future__ import annotations

from hardware import load_hardware, resolve_cost_model
from opgraph.capture import capture
from opgraph.ir import OpKind
from opgraph.transforms import shard_tensor_parallel
from simulators import SimulationConfig, simulate

MODEL = "llama-3.1-70b"  # a shipped preset (config only)
BATCH = 8  # sequences decoding together
KV_LEN = 4096  # tokens already in each sequence's KV cache
TP = 2  # tensor-parallel ranks (GPUs)
ENGINES = 1  # compute engines per GPU
HARDWARE = "h100"  # catalog name; its interconnect is NVLink 4
COST_MODEL = "roofline"


def main() -> None:
    """Capture, shard, simulate both ranks, print the makespan and the collective share."""
    graph = capture(MODEL, phase="decode", batch=BATCH, kv_len=KV_LEN)
    sharded = shard_tensor_parallel(graph, TP)
    collectives = sharded.ops_of(OpKind.COLLECTIVE)
    kinds = sorted({op.definition for op in collectives})
    print(f"{MODEL}: decode of {BATCH} sequences over {KV_LEN} cached tokens, {graph.metadata.num_layers} layers")
    print(
        f"  unsharded: {len(graph.ops)} ops; one rank of TP={TP}: {len(sharded.ops)} ops, "
        f"{len(collectives)} collectives"
    )
    print(f"  collectives: {', '.join(kinds)}")
    weights = sum(op.bytes_read for op in graph.ops_of(OpKind.GEMM))
    weights_rank = sum(op.bytes_read for op in sharded.ops_of(OpKind.GEMM))
    print(
        f"  GEMM operands read per step (mostly weights): {weights / 1e9:.1f} GB unsharded, "
        f"{weights_rank / 1e9:.1f} GB per rank"
    )

    hw = load_hardware(HARDWARE)
    config = SimulationConfig.standard(ENGINES, tp=TP)
    result = simulate(sharded, hw, resolve_cost_model(COST_MODEL), config)
    st = result.stats()
    coll = st.by_kind.get(OpKind.COLLECTIVE.value)
    coll_us = coll.busy_us if coll is not None else 0.0
    print()
    print(f"{hw.name} x{TP}, {hw.interconnect.name or 'interconnect'}, cost model {result.cost_model_name}")
    print(f"  makespan          {st.makespan_us / 1e3:9.3f} ms")
    print(f"  collective time   {coll_us / 1e3:9.3f} ms per rank ({coll_us / st.makespan_us:.1%} of the makespan)")
    print(f"  device time       {st.serial_us / 1e3:9.3f} ms per rank")
    waits = ", ".join(f"{w / 1e3:.3f} ms" for w in st.collective_wait_us)
    print(f"  collective wait   {waits} (per rank: waiting for the other rank and the link)")
    print()
    print(f"  {'kind':<12} {'ops':>5} {'ms':>9} {'share':>7}")
    for kind, row in st.by_kind.items():
        print(f"  {kind:<12} {row.ops:>5} {row.busy_us / 1e3:9.3f} {row.share:7.1%}")


if __name__ == "__main__":
    main()
