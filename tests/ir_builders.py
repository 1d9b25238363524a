"""Builders of IR pieces shaped as capture records them (tensor specs, aten calls, ``nn.Linear`` GEMMs),
shared by the hand-written graphs of the replay, warm-input and catalog tests.

Not a test module: import it as ``tests.ir_builders``.
"""

from __future__ import annotations

from typing import Any

from opgraph.ir import AtenCall, DType, Gemm, TensorSpec

BF16 = DType.bf16


def t(*shape: int, dtype: DType = BF16, strides: tuple[int, ...] | None = None, tid: int | None = None) -> TensorSpec:
    """A tensor spec (``tid``: the id of the value it holds, for data flow)."""
    return TensorSpec(shape=shape, dtype=dtype, strides=strides, id=tid)


def call(*args: Any, **kw: Any) -> AtenCall:
    """An aten call."""
    return AtenCall(args=args, keywords=kw)


def T(i: int) -> dict[str, int]:
    """The encoding of input ``i`` in an aten call."""
    return {"tensor": i}


def mm(
    i: int,
    m: int,
    n: int,
    k: int,
    dtype: DType = BF16,
    *,
    tids: tuple[int | None, int | None, int | None] = (None, None, None),
    **fields: Any,
) -> Gemm:
    """``aten.mm`` with a transposed weight, as an ``nn.Linear`` records (``tids``: the ids of the
    activation, the weight and the output; ``fields``: more of the op's fields, such as its scope)."""
    x, w, out = tids
    return Gemm(
        id=i, target="aten.mm.default", m=m, n=n, k=k, dtype=dtype,
        inputs=(t(m, k, dtype=dtype, tid=x), t(k, n, dtype=dtype, strides=(1, k), tid=w)),
        outputs=(t(m, n, dtype=dtype, tid=out),), call=call(T(0), T(1)), **fields,
    )  # fmt: skip
