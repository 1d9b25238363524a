"""Unique configs: dedup by definition + shapes + dtypes + call, counts, time shares, many graphs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import gemm_graph, tiny_graph

from opgraph.ir import GraphMetadata, OpGraph
from tests.ir_builders import mm, t
from validators import config_key, cost_estimator, unique_configs
from validators.configs import kinds_filter


def test_identity_fields_do_not_split_configs() -> None:
    a = mm(0, 8, 16, 32)
    b = a.model_copy(update={"id": 7, "scope": "model.layers.3.mlp", "layer": 3})
    assert config_key(a) == config_key(b)
    c = mm(1, 8, 16, 64)
    assert config_key(a) != config_key(c)
    # Strides are part of the config: a contiguous weight is another kernel layout.
    d = a.model_copy(update={"inputs": (a.inputs[0], t(32, 16))})
    assert config_key(a) != config_key(d)


def test_counts_and_views_excluded() -> None:
    g = tiny_graph()
    cfgs = unique_configs(g)
    by_def = {c.definition: c for c in cfgs}
    assert by_def["gemm_n32_k32"].count == 2
    assert by_def["gemm_n32_k32"].op_ids == [4, 5]
    assert not any(c.op.kind.value == "view" for c in cfgs)  # type: ignore[attr-defined]
    assert sum(c.count for c in cfgs) == len(g.ops) - 1
    with_views = unique_configs(g, include_views=True)
    assert len(with_views) == len(cfgs) + 1


def test_shares_sum_to_one_and_sort_by_cost() -> None:
    cfgs = unique_configs(tiny_graph(), estimate=cost_estimator())
    shares = [c.share for c in cfgs]
    assert all(s is not None for s in shares)
    assert sum(s or 0.0 for s in shares) == pytest.approx(1.0)
    costs = [c.count * (c.est_us or 0.0) for c in cfgs]
    assert costs == sorted(costs, reverse=True)


def test_many_graphs_merge_and_name_their_sources() -> None:
    a = gemm_graph("m1", sizes=(8, 16))
    b = gemm_graph("m2", sizes=(16, 24))
    cfgs = unique_configs([a, b])
    by_def = {c.definition: c for c in cfgs}
    assert by_def["gemm_n16_k16"].count == 4
    assert by_def["gemm_n16_k16"].graphs == ["m1:prefill", "m2:prefill"]
    assert by_def["gemm_n8_k16"].graphs == ["m1:prefill"]


def test_kinds_filter() -> None:
    keep = kinds_filter(["gemm"])
    assert {c.op.kind.value for c in unique_configs(tiny_graph()) if keep(c)} == {"gemm"}  # type: ignore[attr-defined]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([8, 16, 24, 32]), min_size=1, max_size=12))
def test_total_count_is_preserved(ns: list[int]) -> None:
    ops = tuple(mm(i, 4, n, 16) for i, n in enumerate(ns))
    g = OpGraph(metadata=GraphMetadata(model="p"), ops=ops)
    cfgs = unique_configs(g, estimate=cost_estimator())
    assert sum(c.count for c in cfgs) == len(ns)
    assert len(cfgs) == len(set(ns))


def test_estimates_come_from_the_hardware_roofline_of_the_device_given() -> None:
    from hardware import load_hardware, resolve_cost_model
    from opgraph.ir import Other

    big, small = mm(0, 4096, 4096, 4096), mm(1, 16, 4096, 4096)
    h100 = load_hardware("h100")
    roofline = resolve_cost_model("roofline")
    # The default is the hardware package's roofline on a catalog GPU, not a private copy of one.
    assert cost_estimator()(big) == pytest.approx(roofline.estimate(big, h100).seconds)
    assert cost_estimator(load_hardware("a100-80gb"))(big) > cost_estimator(h100)(big)
    assert cost_estimator("h100", "formula")(big) == pytest.approx(
        resolve_cost_model("formula").estimate(big, h100).seconds
    )
    # Larger work ranks first; an op nothing can cost still launches a kernel.
    cfgs = unique_configs(OpGraph(metadata=GraphMetadata(model="p"), ops=(small, big)), estimate=cost_estimator())
    assert [c.op.id for c in cfgs] == [0, 1]
    assert cost_estimator(h100)(Other(id=2, fn="mystery")) == pytest.approx(h100.launch_latency_us * 1e-6)
