"""A small graph of distinct GEMMs and pointwise ops for calibration tests (replays fast on the CPU)."""

from __future__ import annotations

from opgraph.ir import AtenCall, DType, Edge, Elementwise, Gemm, OpGraph, TensorSpec

TWO_TENSORS = AtenCall(args=({"tensor": 0}, {"tensor": 1}))
"""The recorded call of a binary aten op on its two input tensors."""


def _t(*shape: int) -> TensorSpec:
    return TensorSpec(shape=shape, dtype=DType.fp32)


def _mm(op_id: int, m: int, n: int, k: int) -> Gemm:
    return Gemm(
        id=op_id,
        target="aten.mm.default",
        m=m,
        n=n,
        k=k,
        dtype=DType.fp32,
        inputs=(_t(m, k), _t(k, n)),
        outputs=(_t(m, n),),
        call=TWO_TENSORS,
    )


def small_graph() -> OpGraph:
    add = Elementwise(
        id=1,
        target="aten.add.Tensor",
        fn="add",
        numel=32 * 64,
        hidden=64,
        dtype=DType.fp32,
        inputs=(_t(32, 64), _t(32, 64)),
        outputs=(_t(32, 64),),
        call=TWO_TENSORS,
    )
    ops = (_mm(0, 32, 64, 64), add, _mm(2, 32, 128, 64))
    return OpGraph(ops=ops, edges=(Edge(src=0, dst=1), Edge(src=1, dst=2)))
