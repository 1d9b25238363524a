"""transformers' ``batched_mm`` expert GEMMs in the profile model: a regime of their own
(``gemm:grouped:batched_mm``, the sweep's ``moe.*.batched_mm`` series: along the token-expert pairs,
over the experts' ``(n, k)``), one pair included; a profile measured before that series prices them as it
did then (one pair an expert-loop product, more a grouped bmm of a product per pair), and says so."""

from __future__ import annotations

import json
import math
import statistics
import warnings
from pathlib import Path
from typing import Any

import pytest

from hardware import DeviceProfile, ProfileModel, load_hardware, load_profile
from hardware.models.profile import BATCHED_MM, ProfileExtrapolationWarning, profile_points, roofline_seconds
from hardware.profile import hardware_profile
from opgraph.ir import DType, Gemm, TensorSpec
from tests.hardware.profile_builders import gemm_points, point, synthetic_profile

H100 = load_hardware("h100")
SHAPES = ((1536, 2048), (2048, 768), (28672, 4096), (4096, 14336))
"""(n, k) of the synthetic profile's series: Qwen3-30B-A3B's and Mixtral's gate_up and down, as swept."""
PAIRS = (1, 2, 4, 8, 32, 128)
MEASURED = Path(__file__).parents[1] / "data" / "h100" / "batched_mm.json"
"""``batched_mm`` expert GEMMs of five MoE models measured on an H100 (see ``tests/data/h100/README.md``)."""


def _batched_mm(pairs: int, n: int, k: int, definition: str = "moe_batched_mm_e128_h2048_i768_topk8_gate_up") -> Gemm:
    """The expert GEMM capture records: ``pairs`` gathered ``[n, k]`` weight copies @ the pairs' ``[k, 1]``."""
    bf16 = DType.bf16
    return Gemm(
        id=0, m=1, n=n, k=k, batch=pairs, target="moe_experts_gate_up", definition=definition,
        inputs=(TensorSpec(shape=(pairs, n, k), dtype=bf16), TensorSpec(shape=(pairs, k, 1), dtype=bf16)),
        outputs=(TensorSpec(shape=(pairs, n, 1), dtype=bf16),),
    )  # fmt: skip


def _efficiency(pairs: int) -> float:
    """A known efficiency, log-linear in log2 pairs (interpolation along the pairs recovers it exactly)."""
    return math.exp(-2.0 + 0.2 * math.log2(pairs))


def _profile(points: list[Any]) -> DeviceProfile:
    # Dense GEMM points of (n, k) shapes too: a sibling of the same kind the regime must not borrow from.
    return synthetic_profile(H100, [*gemm_points(H100), *points])


def test_batched_mm_gemms_are_predicted_from_their_own_series_along_the_pairs() -> None:
    series = [point(_batched_mm(p, n, k), _efficiency(p), H100, 9e-6) for n, k in SHAPES for p in PAIRS]
    model = ProfileModel(_profile(series))
    for pairs in (1, 2, 8, 128):  # as measured, one pair included (one kernel from 1 pair up: no jump)
        op = _batched_mm(pairs, 1536, 2048)
        cost = model.estimate(op, H100)
        assert cost.seconds == pytest.approx(roofline_seconds(op, H100) / _efficiency(pairs), rel=1e-9)
        assert cost.detail.startswith(f"profile: {BATCHED_MM} bf16 ") and "no " not in cost.detail
        assert cost.host_s == 9e-6  # a bmm call's issue time, as its points measured it
    between = _batched_mm(16, 2048, 768)  # between the measured 8 and 32 pairs
    cost = model.estimate(between, H100)
    assert cost.seconds == pytest.approx(roofline_seconds(between, H100) / _efficiency(16), rel=1e-9)
    assert "pairs=8@n=2048,k=768..pairs=32@n=2048,k=768" in cost.detail


def test_across_shapes_a_bandwidth_bound_series_lends_its_efficiency_and_a_latency_bound_one_its_time() -> None:
    """An expert shape the sweep did not measure (OLMoE's 2048 x 2048) between measured ones: where the
    neighbours stream their weight copies at one efficiency, it streams its own at that efficiency; where
    they take one time whatever their pairs (a latency floor), it takes that time, not the neighbours'
    efficiency scaled to its larger copies."""
    olmoe = (2048, 2048)
    streaming = [point(_batched_mm(p, n, k), 0.8, H100) for n, k in SHAPES for p in PAIRS]
    model = ProfileModel(_profile(streaming))
    for pairs in (2, 16):
        op = _batched_mm(pairs, *olmoe)
        cost = model.estimate(op, H100)
        assert cost.seconds == pytest.approx(roofline_seconds(op, H100) / 0.8, rel=1e-9)
        assert cost.detail.count("(w ") == 4  # the four measured shapes, inverse-distance weighted
    floor_s = 5e-6
    latency = [
        point(_batched_mm(p, n, k), roofline_seconds(_batched_mm(p, n, k), H100) / floor_s, H100)
        for n, k in SHAPES
        for p in PAIRS
    ]
    cost = ProfileModel(_profile(latency)).estimate(_batched_mm(2, *olmoe), H100)
    assert cost.seconds == pytest.approx(floor_s, rel=1e-9)


def _loop_product(n: int, k: int, definition: str) -> Gemm:
    """One product of the eager experts loop, as capture records it (one token's row)."""
    return Gemm(id=0, m=1, n=n, k=k, target="moe_experts_gate_up", definition=definition)


def _grouped_bmm(products: int, n: int, k: int) -> Gemm:
    """A batched expert GEMM of ``products`` one-row products ([E, 1, k] @ [E, k, n])."""
    return Gemm(
        id=0, m=1, n=n, k=k, groups=products, target="moe_experts_gate_up",
        definition=f"moe_bmm_e{products}_h{k}_topk8_gate_up",
    )  # fmt: skip


def _check_priced_as_before(model: ProfileModel, ops: list[Gemm], hw: Any) -> None:
    """``ops`` (batched_mm GEMMs) are priced as before their regime: one pair as one product of the
    experts loop, more as a grouped bmm of a product per pair; the detail says which."""
    for op in ops:
        cost = model.estimate(op, hw)
        if op.batch == 1:
            twin = _loop_product(op.n, op.k, op.definition.replace("batched_mm", "eager"))
            source = "gemm:grouped:loop"
        else:
            twin = _grouped_bmm(op.batch, op.n, op.k)
            source = "gemm:grouped:bmm"
        before = model.estimate(twin, hw)
        assert (cost.seconds, cost.host_s, cost.efficiency) == (before.seconds, before.host_s, before.efficiency)
        assert cost.detail.startswith(f"profile: {source} "), cost.detail
        assert f"no {BATCHED_MM} points, from {source}" in cost.detail


def test_a_profile_without_the_series_prices_them_as_before_and_says_so() -> None:
    loop = [point(_loop_product(1536, 2048, "moe_loop_e128_n1536_k2048_topk8_gate_up"), 0.3, H100, 4e-4)]
    grouped = [point(_grouped_bmm(e, 1536, 2048), 0.7, H100, 8e-6) for e in (8, 128)]
    model = ProfileModel(_profile([*loop, *grouped]))
    ops = [_batched_mm(p, 1536, 2048) for p in (1, 2, 16)]
    _check_priced_as_before(model, ops, H100)
    # Not from the dense GEMM points of the same (n, k), though they are the kind's largest regime.
    one = model.estimate(ops[0], H100)
    assert one.seconds == pytest.approx(roofline_seconds(ops[0], H100) / 0.3, rel=1e-9)
    assert one.host_s == 30e-6  # one mm call's issue time (the dense points'), not a whole loop's


def _measured() -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = json.loads(MEASURED.read_text())["points"]
    assert len(points) == 45 and len({p["definition"] for p in points}) == 10
    return points


def _measured_op(p: dict[str, Any]) -> Gemm:
    part = "gate_up" if p["definition"].endswith("gate_up") else "down"
    return Gemm(
        id=0, m=1, n=p["n"], k=p["k"], batch=p["pairs"], target=f"moe_experts_{part}", definition=p["definition"]
    )


def _without_series(profile: DeviceProfile) -> DeviceProfile:
    drop = {p.key for p in profile_points(profile, BATCHED_MM)}
    return profile.model_copy(update={"points": tuple(p for p in profile.points if p.key not in drop)})


@pytest.mark.parametrize("device", ["h100-sxm", "h200"])
def test_the_shipped_profiles_without_the_series_keep_todays_prices(device: str) -> None:
    hw = load_hardware(device)
    path = hardware_profile(hw)
    assert path is not None
    model = ProfileModel(_without_series(load_profile(path)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        _check_priced_as_before(model, [_measured_op(p) for p in _measured()], hw)


OUT_OF_SAMPLE = 1.25
"""Largest ratio either way of a prediction to the H100's measurement of the 45 ``batched_mm`` GEMMs
(0.83-1.09 with the series the shipped profile measured on an H100 on 2026-11-26, where the grouped bmm
points gave 0.46-1.59)."""
MEAN_ERROR = 1.08
"""Largest geometric mean of the ratios' distance from 1 (1.03 then, 1.15 from the grouped bmm points)."""


def check_out_of_sample(profile: DeviceProfile) -> list[float]:
    """The ratios of ``profile``'s predictions to the 45 measured ``batched_mm`` GEMMs (five models, of
    which the sweep measured two's shapes, at 1 to 64 pairs), each priced from the regime and within
    :data:`OUT_OF_SAMPLE`, their mean error within :data:`MEAN_ERROR`."""
    hw = load_hardware("h100-sxm")
    model = ProfileModel(profile)
    ratios = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        for p in _measured():
            cost = model.estimate(_measured_op(p), hw)
            ratio = cost.seconds / (p["us"] * 1e-6)
            assert 1 / OUT_OF_SAMPLE < ratio < OUT_OF_SAMPLE, (p, ratio, cost.detail)
            assert cost.detail.startswith(f"profile: {BATCHED_MM} "), cost.detail
            ratios.append(ratio)
    assert math.exp(statistics.fmean(abs(math.log(r)) for r in ratios)) < MEAN_ERROR
    return ratios


def test_the_shipped_h100_profile_predicts_the_measured_batched_mm_gemms() -> None:
    path = hardware_profile(load_hardware("h100-sxm"))
    assert path is not None
    profile = load_profile(path)
    if not profile_points(profile, BATCHED_MM):
        pytest.skip(
            f"the shipped H100 profile has no {BATCHED_MM} points yet (measure the sweep's moe.*.batched_mm "
            "series: benchmarks/gpu/profile_resume.sh)"
        )
    check_out_of_sample(profile)
