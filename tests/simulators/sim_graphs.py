"""Small graphs and cost models shared by the simulator tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from hardware.base import Bound, Cost, UncostedOpError
from hardware.spec import HardwareSpec, HostOverhead, Interconnect
from opgraph.ir import (
    Activation,
    Attention,
    Collective,
    CollectiveKind,
    Edge,
    Elementwise,
    Gemm,
    GraphMetadata,
    Norm,
    OpBase,
    OpGraph,
    Other,
    Rope,
    Stage,
    View,
)

HIDDEN = 2048
HEADS, KV_HEADS, HEAD_DIM = 16, 4, 128
INTER = 8192


def hw(eager_us: float = 10.0, cuda_graph_us: float = 0.5, link_gbps: float = 0.0) -> HardwareSpec:
    """A small inline device spec."""
    return HardwareSpec(
        name="testdev",
        memory_bytes=80e9,
        memory_bandwidth=3e12,
        host=HostOverhead(eager_us=eager_us, cuda_graph_us=cuda_graph_us),
        interconnect=Interconnect(name="link", bandwidth=link_gbps * 1e9, latency_us=1.0),
    )


class PerOpCost:
    """Fixed duration per op kind (us): GEMMs 10, attention 8, everything else 2; views free."""

    TIMES: ClassVar[dict[str, float]] = {"gemm": 10.0, "attention": 8.0, "collective": 5.0}

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        kind = op.kind.value
        if kind == "view":
            return Cost(0.0, Bound.FREE)
        if kind == "other":
            raise UncostedOpError(f"no formula for {op.definition}")
        return Cost(self.TIMES.get(kind, 2.0) * 1e-6, Bound.COMPUTE)


def decoder_layers(layers: int = 1, *, tp: int = 1, step: int | None = None, start_id: int = 0) -> OpGraph:
    """Decode-stage decoder layers as in the seed: norm, Q/K/V in parallel, RoPE, attention, O, MLP.

    With ``tp > 1`` the O and down projections are followed by an all-reduce.
    """
    ops: list[OpBase] = []
    edges: list[Edge] = []
    nid = start_id
    layer = 0

    def add(op_cls: type[OpBase], deps: Iterable[int], **fields: object) -> int:
        nonlocal nid
        op = op_cls(id=nid, layer=layer, stage=Stage.DECODE, step=step, **fields)
        ops.append(op)
        edges.extend(Edge(src=d, dst=nid) for d in deps)
        nid += 1
        return nid - 1

    prev: list[int] = []
    for index in range(layers):
        layer = index
        norm = add(Norm, prev, rows=1, hidden=HIDDEN)
        q = add(Gemm, [norm], m=1, n=HEADS * HEAD_DIM // tp, k=HIDDEN)
        k = add(Gemm, [norm], m=1, n=KV_HEADS * HEAD_DIM // tp, k=HIDDEN)
        v = add(Gemm, [norm], m=1, n=KV_HEADS * HEAD_DIM // tp + 1, k=HIDDEN)
        qr = add(Rope, [q], tokens=1, heads=HEADS // tp, head_dim=HEAD_DIM)
        kr = add(Rope, [k], tokens=1, heads=KV_HEADS // tp, head_dim=HEAD_DIM)
        view = add(View, [v], fn="view")
        att = add(
            Attention,
            [qr, kr, view],
            batch=1,
            q_len=1,
            kv_len=256,
            heads=HEADS // tp,
            kv_heads=KV_HEADS // tp,
            head_dim=HEAD_DIM,
        )
        o = add(Gemm, [att], m=1, n=HIDDEN, k=HEADS * HEAD_DIM // tp)
        if tp > 1:
            o = add(Collective, [o], collective=CollectiveKind.ALL_REDUCE, bytes=HIDDEN * 2, group_size=tp)
        res = add(Elementwise, [o, *prev], fn="add", numel=HIDDEN, hidden=HIDDEN)
        n2 = add(Norm, [res], rows=1, hidden=HIDDEN)
        gate = add(Gemm, [n2], m=1, n=INTER // tp, k=HIDDEN)
        up = add(Gemm, [n2], m=1, n=INTER // tp + 1, k=HIDDEN)
        act = add(Activation, [gate, up], fn="silu", numel=INTER // tp, hidden=INTER // tp, gated=True)
        down = add(Gemm, [act], m=1, n=HIDDEN, k=INTER // tp)
        if tp > 1:
            down = add(Collective, [down], collective=CollectiveKind.ALL_REDUCE, bytes=HIDDEN * 2, group_size=tp)
        prev = [add(Elementwise, [down, res], fn="add", numel=HIDDEN, hidden=HIDDEN)]
    return OpGraph(
        metadata=GraphMetadata(model="test-decoder", num_layers=layers, phase="decode"),
        ops=tuple(ops),
        edges=tuple(edges),
    )


def with_other(graph: OpGraph, count: int = 2) -> OpGraph:
    """``graph`` plus ``count`` ops of kind OTHER (uncosted by :class:`PerOpCost`)."""
    base = max(o.id for o in graph.ops) + 1
    extra = tuple(Other(id=base + i, fn=f"mystery{i}", target=f"aten.mystery{i}.default") for i in range(count))
    return graph.model_copy(update={"ops": graph.ops + extra})


def chain_graph(durations: list[float]) -> tuple[OpGraph, dict[int, float]]:
    """A chain of elementwise ops with the given durations."""
    ops = tuple(Elementwise(id=i, fn="add", numel=8) for i in range(len(durations)))
    edges = tuple(Edge(src=i, dst=i + 1) for i in range(len(durations) - 1))
    return OpGraph(ops=ops, edges=edges), dict(enumerate(durations))
