"""The cost types of ``hardware.base`` and the IR types they share."""

from __future__ import annotations

import hardware
from hardware import RooflineModel, load_hardware
from opgraph.ir import Bound, Gemm, Span


def test_a_costs_bound_is_the_verdict_a_simulated_span_saves() -> None:
    # One enum for what limits an op's time: the cost model's verdict is saved on spans as it is.
    assert hardware.Bound is Bound
    op = Gemm(id=0, target="aten::mm", m=1, n=8192, k=8192)
    cost = RooflineModel().estimate(op, load_hardware("h100"))
    span = Span(name="gemm", track="compute0", start_us=0.0, dur_us=cost.seconds * 1e6, bound=cost.bound)
    assert span.bound is Bound.MEMORY
    assert Span.model_validate_json(span.model_dump_json()).bound is cost.bound
