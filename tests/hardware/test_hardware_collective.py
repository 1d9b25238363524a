"""The alpha-beta collective model: algorithm factors, links, and what every built-in does with collectives."""

from __future__ import annotations

import pytest

from hardware import AlphaBetaCollectiveModel, Bound, UncostedOpError, load_hardware, resolve_cost_model
from opgraph.ir import Collective, CollectiveKind, Gemm

H100 = load_hardware("h100")


def op(kind: CollectiveKind, nbytes: int, g: int) -> Collective:
    return Collective(id=0, collective=kind, bytes=nbytes, group_size=g)


def test_large_ring_all_reduce_meets_the_bandwidth_lower_bound() -> None:
    """Any all-reduce of S bytes over g ranks sends at least 2 (g-1)/g x S per rank (Patarasuk and
    Yuan, 2009); the ring is the algorithm that meets the bound, so its bandwidth term equals it."""
    model = AlphaBetaCollectiveModel(algorithm="ring", include_launch=False, latency_us=0)
    rate = H100.interconnect.bandwidth * model.params.link_efficiency
    for g in (2, 4, 8):
        for nbytes in (2**24, 2**30):
            cost = model.estimate(op(CollectiveKind.ALL_REDUCE, nbytes, g), H100)
            assert cost.seconds == pytest.approx(2 * (g - 1) / g * nbytes / rate)
            assert cost.bound is Bound.LINK


def test_small_all_reduce_is_latency_bound_and_auto_picks_the_tree() -> None:
    small = op(CollectiveKind.ALL_REDUCE, 1024, 8)
    auto = AlphaBetaCollectiveModel().estimate(small, H100)
    ring = AlphaBetaCollectiveModel(algorithm="ring").estimate(small, H100)
    assert auto.seconds < ring.seconds and "tree" in auto.detail
    assert auto.bound is Bound.LAUNCH
    big = op(CollectiveKind.ALL_REDUCE, 2**30, 8)
    assert "ring" in AlphaBetaCollectiveModel().estimate(big, H100).detail


def test_more_ranks_cost_more_latency_and_pcie_is_slower_than_nvlink() -> None:
    model = AlphaBetaCollectiveModel(algorithm="ring")
    two, eight = (model.estimate(op(CollectiveKind.ALL_REDUCE, 4096, g), H100) for g in (2, 8))
    assert eight.seconds > two.seconds
    l40s = load_hardware("l40s")  # no NVLink: goes over PCIe
    big = op(CollectiveKind.ALL_GATHER, 2**26, 4)
    assert "PCIe" in model.estimate(big, l40s).detail
    assert model.estimate(big, l40s).seconds > 5 * model.estimate(big, H100).seconds


def test_one_rank_is_free_and_explicit() -> None:
    cost = AlphaBetaCollectiveModel().estimate(op(CollectiveKind.ALL_REDUCE, 2**20, 1), H100)
    assert cost.seconds == 0 and cost.bound is Bound.FREE and "one rank" in cost.detail


def test_collective_model_declines_other_ops() -> None:
    with pytest.raises(UncostedOpError, match="only collectives"):
        AlphaBetaCollectiveModel().estimate(Gemm(id=0, m=1, n=1, k=1), H100)


@pytest.mark.parametrize("name", ["roofline", "formula", "collective"])
def test_every_builtin_sends_collectives_to_alpha_beta(name: str) -> None:
    c = op(CollectiveKind.REDUCE_SCATTER, 2**24, 4)
    expected = AlphaBetaCollectiveModel().estimate(c, H100)
    assert resolve_cost_model(name).estimate(c, H100) == expected
