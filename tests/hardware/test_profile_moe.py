"""MoE expert products in the profile model: one GEMM per expert (the eager loop, torch's fallback of
``_grouped_mm`` for fp16/fp32) is costed from the profile's expert-loop points, measured as that loop
runs, not from dense GEMMs of a larger shape."""

from __future__ import annotations

import json
import math
import statistics
import warnings
from pathlib import Path
from typing import Any

import pytest

from hardware import ProfileModel, load_hardware
from hardware.models.profile import (
    ProfileExtrapolationWarning,
    roofline_bytes,
    roofline_seconds,
    roofline_terms,
    router_tiles,
)
from hardware.models.table import CostTable, TableEntry, TableModel
from opgraph.ir import DType, ExpertGemm, ExpertPart, ExpertsImpl, Gemm
from tests.hardware.profile_builders import gemm_points, point, synthetic_profile

H100 = load_hardware("h100")
LOOP_EFF = 0.3
"""The loop points' efficiency: small per-expert GEMMs back to back reach less of the roofline."""


def _loop_point(m: int, n: int = 1536, k: int = 2048, experts: int = 128, eff: float = LOOP_EFF) -> object:
    """A point of the expert loop (Qwen3-30B-A3B's gate_up by default): ``experts`` products of ``m`` rows."""
    loop = _expert(experts, 8, ExpertsImpl.LOOP)
    return point(Gemm(id=0, m=m, n=n, k=k, groups=experts, target="moe_experts_gate_up", expert=loop), eff, H100)


def _expert(experts: int, top_k: int, impl: ExpertsImpl = ExpertsImpl.GROUPED_MM) -> ExpertGemm:
    """An expert GEMM's field: one product of torch's fallback (``grouped_mm``), or a loop point's (``loop``)."""
    return ExpertGemm(impl=impl, experts=experts, top_k=top_k, part=ExpertPart.GATE_UP)


def _model() -> ProfileModel:
    points = [*gemm_points(H100), *(_loop_point(m) for m in (1, 32, 512))]
    return ProfileModel(synthetic_profile(H100, points))


def test_a_per_expert_product_is_costed_from_the_expert_loop_points() -> None:
    product = Gemm(
        id=0, m=32, n=1536, k=2048, dtype=DType.fp16, target="moe_experts_gate_up",
        definition="moe_grouped_mm_e128_h2048_i768_topk8_gate_up",
    )  # fmt: skip
    cost = _model().estimate(product, H100)
    assert "gemm:grouped:loop" in cost.detail
    assert math.isclose(cost.seconds, roofline_seconds(product, H100) / LOOP_EFF, rel_tol=1e-6)


SMALL, LARGE = (1536, 2048, 128), (28672, 4096, 8)
"""(n, k, experts) of two layers' expert products: Qwen3-30B-A3B's gate_up (6 MB of weights), Mixtral's (235 MB)."""


def test_an_expert_product_is_priced_along_its_bytes_whatever_its_layers_shape_and_experts() -> None:
    # Loop points of two layers at the same rows, 0.3 and 0.75 of the roofline: a product of a third layer
    # (Qwen2-57B-A14B: 64 experts, n 5120, k 3584) between their bytes takes the efficiency log-linear in
    # its bytes, whatever its n, k and experts (an interpolation over those mixed the layers' efficiencies
    # by their distance in n, k and experts: 41% long on an H100).
    model = ProfileModel(
        synthetic_profile(H100, [*gemm_points(H100), _loop_point(256, *SMALL, 0.3), _loop_point(256, *LARGE, 0.75)])
    )
    product = Gemm(id=0, m=256, n=5120, k=3584, dtype=DType.fp16, target="moe_experts_gate_up", expert=_expert(64, 8))
    small, large = (Gemm(id=0, m=256, n=n, k=k) for n, k, _ in (SMALL, LARGE))
    t = math.log(roofline_bytes(product) / roofline_bytes(small)) / math.log(
        roofline_bytes(large) / roofline_bytes(small)
    )
    eff = math.exp(math.log(0.3) + t * math.log(0.75 / 0.3))
    cost = model.estimate(product, H100)
    assert "gemm:grouped:loop" in cost.detail and "bytes=" in cost.detail
    assert math.isclose(cost.seconds, roofline_seconds(product, H100) / eff, rel_tol=1e-6)


def test_a_row_count_measured_on_small_experts_only_does_not_price_a_large_product() -> None:
    # A profile whose loop points are not on one row grid (the H200's of 2026-11-26: 1,024 rows of the small
    # layer only): a large layer's product at those rows is priced from the rows both layers measured, between
    # the large layer's own costs there, not held at the small layer's efficiency.
    points = [_loop_point(m, *shape, eff) for m in (512, 2048) for shape, eff in ((SMALL, 0.3), (LARGE, 0.75))]
    model = ProfileModel(synthetic_profile(H100, [*gemm_points(H100), *points, _loop_point(1024, *SMALL, 0.3)]))
    n, k, experts = LARGE
    at = {m: model.estimate(Gemm(id=0, m=m, n=n, k=k, target="moe_experts_gate_up", expert=_expert(experts, 2)), H100)
          for m in (512, 1024, 2048)}  # fmt: skip
    assert at[512].seconds < at[1024].seconds < at[2048].seconds
    assert "m=1024" not in at[1024].detail


def test_a_dense_gemm_of_the_same_shape_stays_a_gemm() -> None:
    dense = Gemm(id=0, m=128, n=1536, k=2048, target="aten.mm.default")
    cost = _model().estimate(dense, H100)
    assert "gemm:grouped" not in cost.detail and cost.detail.startswith("profile: gemm ")


def test_a_per_expert_product_pays_the_issue_time_of_one_call() -> None:
    # The loop points' host time is that of a whole loop of experts; one product issues one mm.
    points = [*gemm_points(H100, host_s=30e-6)]
    loop = _loop_point(32)
    points.append(loop.model_copy(update={"host_s": 128 * 30e-6}))  # type: ignore[attr-defined]
    model = ProfileModel(synthetic_profile(H100, points))
    product = Gemm(
        id=0, m=32, n=1536, k=2048, target="moe_experts_gate_up",
        definition="moe_grouped_mm_e128_h2048_i768_topk8_gate_up",
    )  # fmt: skip
    assert model.estimate(product, H100).host_s == 30e-6


def test_an_op_of_a_field_defined_kind_is_priced_on_the_bytes_its_fields_imply() -> None:
    # The profile's routing points have no tensors (the recipe builds its own): an op of the same
    # fields is predicted at the measured time, whatever bytes its recorded tensors add up to.
    from opgraph.ir import MoeRouting, TensorSpec

    fields = {"fn": "combine", "tokens": 2048, "experts": 8, "top_k": 2, "hidden": 4096}
    measured = point(MoeRouting(id=0, **fields), 0.25, H100)
    model = ProfileModel(synthetic_profile(H100, [*gemm_points(H100), measured]))
    recorded = MoeRouting(
        id=0, **fields, inputs=(TensorSpec(shape=(4096, 4096), dtype=DType.bf16),),
        outputs=(TensorSpec(shape=(2048, 4096), dtype=DType.bf16),),
    )  # fmt: skip
    assert recorded.total_bytes != MoeRouting(id=0, **fields).total_bytes
    assert math.isclose(model.estimate(recorded, H100).seconds, measured.seconds, rel_tol=1e-9)


def _grouped(m: int, definition: str = "moe_grouped_mm_e8_h4096_i14336_topk2_gate_up") -> Gemm:
    return Gemm(
        id=0, m=m, n=28672, k=4096, groups=8, target="moe_experts_gate_up", definition=definition,
    )  # fmt: skip


def test_expected_row_tiles_of_a_uniform_router() -> None:
    from hardware.models.profile import TILE_ROWS, expected_row_tiles

    # 2048 tokens picking 2 of 8 experts: 512 rows each on average, +- 20; half the experts spill into a
    # fifth 128-row tile. Every token picking every expert: exactly its rows, no spill.
    assert expected_row_tiles(512, 8, 2) == pytest.approx(4.5, abs=0.02)
    assert expected_row_tiles(512, 8, 8) == 4.0
    # Far from a tile boundary the loads' spread costs (almost) nothing; no tile holds more than its rows.
    assert expected_row_tiles(448, 8, 2) == pytest.approx(4.0, abs=0.01)
    for rows in (128, 300, 512, 1000, 2048):
        assert expected_row_tiles(rows, 128, 8) >= rows / TILE_ROWS


def test_a_grouped_kernel_pays_the_row_tiles_of_a_routers_uneven_loads() -> None:
    """The profile measured the grouped kernel with even loads; a router's are uneven (held-out Mixtral
    prefill: its two expert GEMMs ran 10% and 18% over the even-load points)."""
    points = [*gemm_points(H100), *(point(_grouped(m), 0.6, H100) for m in (128, 512, 2048))]
    model = ProfileModel(synthetic_profile(H100, points))
    even = roofline_seconds(_grouped(512), H100) / 0.6
    cost = model.estimate(_grouped(512), H100)
    assert math.isclose(cost.seconds, even * 4.488 / 4, rel_tol=2e-3)  # compute-bound: the tiles' share
    assert "row tiles x1.12" in cost.detail and "gemm:grouped:grouped_mm" in cost.detail
    # Bound by the experts' weights (few rows each), the padded rows' MMA work hides under the traffic.
    light = Gemm(
        id=0, m=128, n=1536, k=2048, groups=128, target="moe_experts_gate_up",
        definition="moe_grouped_mm_e128_h2048_i768_topk8_gate_up",
    )  # fmt: skip
    compute_s, memory_s = roofline_terms(light, H100)
    assert compute_s * 1.47 < memory_s  # 1.47: the expected tiles of 128 rows, Binomial(2048, 1/16)
    model2 = ProfileModel(synthetic_profile(H100, [*gemm_points(H100), point(light, 0.6, H100)]))
    assert math.isclose(model2.estimate(light, H100).seconds, roofline_seconds(light, H100) / 0.6, rel_tol=1e-9)
    # Within a tile, or without the experts and top-k in its definition: as measured.
    assert math.isclose(model.estimate(_grouped(64), H100).seconds, roofline_seconds(_grouped(64), H100) / 0.6)
    plain = _grouped(512, "grouped_gemm_e8_n28672_k4096_grouped_mm")
    assert "row tiles" not in model.estimate(plain, H100).detail


def test_a_calibrated_table_charges_the_same_row_tiles() -> None:
    """Replay times a grouped expert GEMM with even loads too: the table model charges a router's tiles
    on its measured and interpolated times as the profile model does on its points."""
    measured = [TableEntry.from_op(_grouped(m), seconds=1e-3 * m / 512, samples=9) for m in (256, 512, 1024)]
    model = TableModel(CostTable(entries=tuple(measured)))
    tiles, note = router_tiles(_grouped(512), H100)
    assert tiles == pytest.approx(4.488 / 4, rel=2e-3)  # compute-bound: the tiles' share
    exact = model.estimate(_grouped(512), H100)
    assert exact.seconds == pytest.approx(1e-3 * tiles) and note in exact.detail and "measured" in exact.detail
    between = model.estimate(_grouped(700), H100)
    assert "interpolated" in between.detail and "row tiles" in between.detail
    assert between.seconds == pytest.approx(1e-3 * 700 / 512 * router_tiles(_grouped(700), H100)[0], rel=1e-6)
    # Within a tile, or not named as a router's experts: as measured.
    small = TableModel(CostTable(entries=(TableEntry.from_op(_grouped(64), seconds=2e-4, samples=9),)))
    assert small.estimate(_grouped(64), H100).seconds == pytest.approx(2e-4)
    assert router_tiles(_grouped(512, "grouped_gemm_e8_n28672_k4096_grouped_mm"), H100) == (1.0, "")


BATCHED_MM_H100 = Path(__file__).parents[1] / "data" / "h100" / "batched_mm.json"
"""``batched_mm`` expert GEMMs of five MoE models measured on an H100 (see ``tests/data/h100/README.md``)."""


def _batched_mm(point: dict[str, Any]) -> Gemm:
    """The expert GEMM capture records for a measured point: ``pairs`` products of one row."""
    part = "gate_up" if point["definition"].endswith("gate_up") else "down"
    return Gemm(
        id=0, m=1, n=point["n"], k=point["k"], batch=point["pairs"], target=f"moe_experts_{part}",
        definition=point["definition"],
    )  # fmt: skip


def test_batched_mm_expert_gemms_are_priced_as_the_h100_ran_them() -> None:
    """transformers' ``batched_mm`` experts run one bmm of the token-expert pairs' gathered weights: a
    profile without its own series (the shipped H100 profile's points less any of
    ``gemm:grouped:batched_mm``) prices it from its grouped bmm points (a product per pair), which its
    sweep measured for Qwen3-30B-A3B and Mixtral only. Against measurements on an H100 of those two and
    three models it never saw (Llama-4-Scout, OLMoE, DeepSeek-V2-Lite), at 1 to 64 pairs: from 8 pairs
    within 25%, and within 2.2x where few pairs' small kernels run into the latency the grouped points
    (8 or more products each) do not hold. One pair is one expert product: priced from the expert-loop
    points, which time the expert's products one at a time."""
    from hardware import load_profile
    from hardware.models.profile import BATCHED_MM, profile_points
    from hardware.profile import hardware_profile

    h100 = load_hardware("h100-sxm")
    path = hardware_profile(h100)
    assert path is not None
    shipped = load_profile(path)
    own = {p.key for p in profile_points(shipped, BATCHED_MM)}
    model = ProfileModel(shipped.model_copy(update={"points": tuple(p for p in shipped.points if p.key not in own)}))
    points = json.loads(BATCHED_MM_H100.read_text())["points"]
    assert len(points) == 45 and len({p["definition"] for p in points}) == 10
    errors = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        for p in points:
            op = _batched_mm(p)
            cost = model.estimate(op, h100)
            ratio = cost.seconds / (p["us"] * 1e-6)
            assert 1 / 2.2 < ratio < 2.2, (p, ratio)
            if p["pairs"] == 1:
                assert 1 / 1.7 < ratio < 1.7, (p, ratio)
            if p["pairs"] >= 8:
                assert 0.75 < ratio < 1.25, (p, ratio)
            regime = "gemm:grouped:loop" if p["pairs"] == 1 else "gemm:grouped:bmm"
            assert cost.detail.startswith(f"profile: {regime} "), (p, cost.detail)
            errors.append(abs(math.log(ratio)))
    assert math.exp(statistics.fmean(errors)) < 1.2
