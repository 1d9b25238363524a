"""Synthetic inputs: strides, valid index ranges, causal masks, MoE routing counts, device checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opgraph.ir import DType, TensorSpec
from tests.ir_builders import T, call, t
from validators import DeviceError, resolve_device, routing_counts
from validators.inputs import causal_mask, index, make_generator, make_tensor, routing_skew
from validators.recipes.aten import input_domains

CPU = torch.device("cpu")


def test_strided_tensor_has_recorded_layout() -> None:
    spec = TensorSpec(shape=(4, 8), dtype=DType.bf16, strides=(1, 4))
    x = make_tensor(spec, CPU, make_generator(CPU, 0))
    assert x.shape == (4, 8) and x.stride() == (1, 4) and x.dtype == torch.bfloat16
    expanded = make_tensor(TensorSpec(shape=(3, 5), dtype=DType.fp32, strides=(0, 1)), CPU, make_generator(CPU, 0))
    assert expanded.stride() == (0, 1)
    assert torch.equal(expanded[0], expanded[2])


def test_same_seed_same_values() -> None:
    spec = TensorSpec(shape=(16,), dtype=DType.fp32)
    a = make_tensor(spec, CPU, make_generator(CPU, 3))
    b = make_tensor(spec, CPU, make_generator(CPU, 3))
    assert torch.equal(a, b)


def test_index_domains_follow_the_indexed_dim() -> None:
    from opgraph.ir import Memory

    op = Memory(
        id=0, target="aten.index_select.default", fn="index", numel=10,
        inputs=(t(5, 7), t(100, dtype=DType.int64)), call=call(T(0), 0, T(1)),
    )  # fmt: skip
    dom = input_domains(op)[1]
    assert dom.bound == 5
    x = make_tensor(op.inputs[1], CPU, make_generator(CPU, 0), dom)
    assert int(x.min()) >= 0 and int(x.max()) < 5
    # An integer input no rule knows stays below every dimension of every input.
    other = Memory(
        id=1,
        target="aten.foo.default",
        fn="foo",
        numel=1,
        inputs=(t(3, 9), t(50, dtype=DType.int64)),
        call=call(T(0), T(1)),
    )
    assert input_domains(other)[1].bound == 3


def test_unique_indices_when_possible() -> None:
    x = make_tensor(TensorSpec(shape=(6,), dtype=DType.int64), CPU, make_generator(CPU, 0), index(6, unique=True))
    assert sorted(x.tolist()) == list(range(6))


def test_causal_mask_bottom_right_with_window() -> None:
    m = causal_mask(2, 5, device=CPU, dtype=torch.bool)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    w = causal_mask(3, 3, device=CPU, dtype=torch.bool, window=2)
    assert w.tolist() == [[True, False, False], [True, True, False], [False, True, True]]
    f = causal_mask(2, 2, device=CPU, dtype=torch.float32)
    assert f[0, 1] == torch.finfo(torch.float32).min and f[1, 1] == 0


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 64), experts=st.integers(1, 32), top_k=st.integers(1, 8),
    skew=st.sampled_from([0.0, 0.5, 1.2, 3.0]),
)  # fmt: skip
def test_routing_counts_invariants(tokens: int, experts: int, top_k: int, skew: float) -> None:
    top_k = min(top_k, experts)
    counts = routing_counts(tokens, experts, top_k, skew)
    assert len(counts) == experts
    assert sum(counts) == tokens * top_k
    assert all(0 <= c <= tokens for c in counts)
    if skew == 0:
        assert max(counts) - min(counts) <= 1


def test_routing_skew_from_metadata() -> None:
    assert routing_skew(("MoE routing is modelled ... balanced",)) == 0.0
    assert routing_skew(("MoE routing: expert loads follow a Zipf law of exponent 1.2 (the busiest first)",)) == 1.2
    assert routing_skew((), {"moe_skew": 0.8}) == 0.8
    assert routing_skew(("MoE routing skew 1.5",)) == 1.5


def test_bad_devices_are_clear_errors() -> None:
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(DeviceError, match="not a device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="cannot use cuda"):
            resolve_device("cuda")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n:
        with pytest.raises(DeviceError, match="does not exist"):
            resolve_device(f"cuda:{n}")
