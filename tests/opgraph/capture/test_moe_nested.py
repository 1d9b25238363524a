"""Capture marks what torch's ``_grouped_mm`` fallback (fp16: one ``mm`` per expert inside one
Python-level call) does on the host: the call's first product stands for the call and holds its copy
of the offsets to the host (a host sync), C++ issues the other products (nested: no framework time).
A grouped kernel (bf16) is neither."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from opgraph.capture import capture
from opgraph.capture.lowering import moe
from opgraph.ir import NESTED_MARK, SYNC_MARK, host_syncs, is_nested
from opgraph.ir.ops import OpKind
from tests.opgraph.capture.test_capture_architectures import tiny_config


def _experts(g: Any) -> list[Any]:
    return [o for o in g.ops_of(OpKind.GEMM) if o.target.startswith("moe_experts")]


def _calls(g: Any) -> list[list[Any]]:
    """The expert products of each grouped call, in program order (a call: one layer's one part)."""
    out: dict[tuple[int | None, str], list[Any]] = {}
    for o in _experts(g):
        out.setdefault((o.layer, o.target), []).append(o)
    return list(out.values())


def test_capture_and_the_host_model_share_the_marks() -> None:
    assert (moe.NESTED_MARK, moe.SYNC_MARK) == (NESTED_MARK, SYNC_MARK)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_each_fallback_call_is_one_synced_entry_then_nested_products(tmp_path: Path, model_type: str) -> None:
    path = tiny_config(tmp_path, model_type)
    g = capture(path, device="meta", seq_len=12, dtype="fp16")
    calls = _calls(g)
    layers = {o.layer for o in g.ops if o.layer is not None}
    assert len(calls) == 2 * len(layers)  # gate_up and down of every layer
    for products in calls:
        first, *rest = products
        assert first.definition.endswith(SYNC_MARK) and not is_nested(first)
        assert rest and all(is_nested(o) for o in rest)
    assert set(host_syncs(g)) == {products[0].id for products in calls}
    assert sum(is_nested(o) for o in g.ops) == sum(len(p) - 1 for p in calls)
    # the offsets copy went into the call's entry: no op of its own reads the integer offsets
    experts = next(o.experts for o in g.ops_of(OpKind.MOE_ROUTING))
    copies = [
        o for o in g.ops_of(OpKind.MEMORY) if any(t.shape == (experts,) and not t.dtype.is_float for t in o.inputs)
    ]
    assert copies == []


def test_a_decode_with_idle_experts_keeps_one_sync_per_call(tmp_path: Path) -> None:
    # One token picks top_k of the experts: the idle experts' products fold away; each call keeps its sync.
    path = tiny_config(tmp_path, "qwen3_moe")
    g = capture(path, phase="decode", batch=1, kv_len=8, device="meta", dtype="fp16", moe_skew=0.0)
    calls = _calls(g)
    assert calls and len(host_syncs(g)) == len(calls)
    for products in calls:
        assert products[0].definition.endswith(SYNC_MARK)
        assert all(is_nested(o) for o in products[1:])


def test_a_grouped_kernel_is_neither_nested_nor_a_sync(tmp_path: Path) -> None:
    g = capture(tiny_config(tmp_path, "qwen3_moe"), device="meta", seq_len=12, dtype="bf16")
    assert _experts(g)
    assert not any(is_nested(o) for o in g.ops) and host_syncs(g) == ()
