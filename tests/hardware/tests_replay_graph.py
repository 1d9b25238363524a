"""A small graph of distinct GEMMs and pointwise ops for calibration tests (replays fast on the CPU)."""

from __future__ import annotations

from opgraph.ir import AtenCall, DType, Edge, Elementwise, Gemm, OpGraph, TensorSpec


def small_graph() -> OpGraph:
    def t(*shape: int) -> TensorSpec:
        return TensorSpec(shape=shape, dtype=DType.fp32)

    ops = [
        Gemm(
            id=0,
            target="aten.mm.default",
            m=32,
            n=64,
            k=64,
            dtype=DType.fp32,
            inputs=(t(32, 64), t(64, 64)),
            outputs=(t(32, 64),),
            call=AtenCall(args=({"tensor": 0}, {"tensor": 1})),
        ),
        Elementwise(
            id=1,
            target="aten.add.Tensor",
            fn="add",
            numel=32 * 64,
            hidden=64,
            dtype=DType.fp32,
            inputs=(t(32, 64), t(32, 64)),
            outputs=(t(32, 64),),
            call=AtenCall(args=({"tensor": 0}, {"tensor": 1})),
        ),
        Gemm(
            id=2,
            target="aten.mm.default",
            m=32,
            n=128,
            k=64,
            dtype=DType.fp32,
            inputs=(t(32, 64), t(64, 128)),
            outputs=(t(32, 128),),
            call=AtenCall(args=({"tensor": 0}, {"tensor": 1})),
        ),
    ]
    return OpGraph(ops=tuple(ops), edges=(Edge(src=0, dst=1), Edge(src=1, dst=2)))
