"""The profile model prices an expert GEMM from its typed ``expert`` field, whatever its definition says:
the same op renamed costs what the name capture gives it costs (on the shipped H100 profile, from the
expert points its sweep measured), and a GEMM without the field is a dense or grouped GEMM however it is
named."""

from __future__ import annotations

import pytest

from hardware import ProfileModel, load_hardware, load_profile
from hardware.models.profile import profile_features, router_tiles
from hardware.profile import hardware_profile
from opgraph.ir import ExpertGemm, ExpertPart, ExpertsImpl, Gemm

H100 = load_hardware("h100-sxm")


@pytest.fixture(scope="module")
def shipped() -> ProfileModel:
    path = hardware_profile(H100)
    assert path is not None
    return ProfileModel(load_profile(path))


def _expert(impl: ExpertsImpl, experts: int = 128, top_k: int = 8) -> ExpertGemm:
    return ExpertGemm(impl=impl, experts=experts, top_k=top_k, part=ExpertPart.GATE_UP)


CASES = {
    # (shape fields, the definition capture or the sweep gives it, its typed expert field, its regime)
    "grouped_mm": (
        {"m": 512, "n": 1536, "k": 2048, "groups": 128},
        "moe_grouped_mm_e128_h2048_i768_topk8_gate_up",
        _expert(ExpertsImpl.GROUPED_MM),
        "gemm:grouped:grouped_mm",
    ),
    "fallback_product": (
        {"m": 64, "n": 1536, "k": 2048},
        "moe_grouped_mm_e128_h2048_i768_topk8_gate_up@nested",
        _expert(ExpertsImpl.GROUPED_MM),
        "gemm:grouped:loop",
    ),
    "batched_mm": (
        {"m": 1, "n": 1536, "k": 2048, "batch": 64},
        "moe_batched_mm_e128_h2048_i768_topk8_gate_up",
        _expert(ExpertsImpl.BATCHED_MM),
        "gemm:grouped:batched_mm",
    ),
    "bmm": (
        {"m": 4, "n": 1536, "k": 2048, "groups": 128},
        "moe_bmm_e128_h2048_topk8_gate_up",
        _expert(ExpertsImpl.BMM),
        "gemm:grouped:bmm",
    ),
}


@pytest.mark.filterwarnings("ignore::hardware.models.profile.ProfileExtrapolationWarning")  # the dense twin
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_renamed_expert_gemm_is_priced_from_its_expert_field(shipped: ProfileModel, case: str) -> None:
    fields, definition, expert, regime = CASES[case]
    named = Gemm(id=0, target="moe_experts_gate_up", definition=definition, **fields)  # type: ignore[arg-type]
    assert named.expert == expert  # the legacy path: a definition only, the field read from it
    renamed = Gemm(id=0, target="experts", definition="my_experts_up", expert=expert, **fields)  # type: ignore[arg-type]
    features = profile_features(renamed)
    assert features is not None and features.regime == regime
    want, got = shipped.estimate(named, H100), shipped.estimate(renamed, H100)
    assert got.seconds == want.seconds and got.host_s == want.host_s
    assert regime in got.detail
    # Without the field the same shape and name is no expert GEMM: another regime, another price.
    plain = Gemm(id=0, target="experts", definition="my_experts_up", **fields)  # type: ignore[arg-type]
    assert plain.expert is None and regime not in shipped.estimate(plain, H100).detail


def test_the_row_tiles_of_a_router_come_from_the_fields_experts_and_top_k() -> None:
    # 512 rows of each of 8 experts, top-2: a uniform router's loads cross tile boundaries the even
    # loads do not (4.488 expected tiles against 4; tests/hardware/test_profile_moe.py).
    fields = {"m": 512, "n": 28672, "k": 4096, "groups": 8}
    expert = _expert(ExpertsImpl.GROUPED_MM, experts=8, top_k=2)
    renamed = Gemm(id=0, definition="mixtral_w13", expert=expert, **fields)  # type: ignore[arg-type]
    tiles, note = router_tiles(renamed, H100)
    assert tiles == pytest.approx(4.488 / 4, rel=2e-3) and "row tiles" in note
    # The definition names experts and top-k, but the field says this is no expert GEMM: no router.
    legacy_name = "moe_grouped_mm_e8_h4096_i14336_topk2_gate_up"
    dense = Gemm(id=0, target="aten._grouped_mm.default", definition=legacy_name, expert=None, **fields)  # type: ignore[arg-type]
    assert router_tiles(dense, H100) == (1.0, "")
