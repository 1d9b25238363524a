"""Host times of a sweep on a host whose speed drifts: scaled to the host at its fastest by the
reference call timed beside each point (``ProfilePoint.host_ref_s``, ``DeviceProfile.issue_s``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hardware import ProfileModel, load_hardware
from hardware.profile import HOST_REF_QUANTILE, DeviceProfile, ProfileDevice, ProfilePoint, fastest_ref
from opgraph.ir import Gemm, Norm
from tests.hardware.profile_builders import gemm_points, norm_points, synthetic_profile
from validators.profile import SweepPoint, finish_profile, sweep_timing

FAST_REF, SLOW_REF = 6.5e-6, 10.0e-6
"""The reference call's issue time at a GPU host's two speeds (the held-out runs' host probes: 6.4-7.0
and 9.4-11 us per tiny launch)."""


def _slowed(points: list[ProfilePoint], slow_every: int = 2) -> list[ProfilePoint]:
    """``points`` as a sweep measures them on a host that runs slow for every ``slow_every``-th point:
    the slow ones' host times (and reference) stretched by the slow state's factor."""
    out = []
    for i, p in enumerate(points):
        slow = i % slow_every == 0
        ref = SLOW_REF if slow else FAST_REF
        host = p.host_s * ref / FAST_REF if p.host_s is not None else None
        out.append(p.model_copy(update={"host_s": host, "host_ref_s": ref}))
    return out


def test_issue_s_scales_a_point_to_the_host_at_its_fastest() -> None:
    p = ProfilePoint(key="k", op=Norm(id=0, rows=1, hidden=4096), seconds=1e-5, host_s=20e-6, host_ref_s=SLOW_REF)
    prof = DeviceProfile(points=(p,), host_ref_us=FAST_REF * 1e6)
    assert prof.issue_s(p) == pytest.approx(20e-6 * FAST_REF / SLOW_REF)
    # No reference in the point or the profile (profiles measured before the sweep timed it): as measured.
    assert DeviceProfile(points=(p,)).issue_s(p) == 20e-6
    bare = p.model_copy(update={"host_ref_s": None})
    assert prof.issue_s(bare) == 20e-6
    assert prof.issue_s(p.model_copy(update={"host_s": None})) is None


@given(st.lists(st.floats(min_value=1e-6, max_value=1e-4), min_size=1, max_size=60))
def test_fastest_ref_is_the_low_quantile_of_the_points_references(refs: list[float]) -> None:
    op = Norm(id=0, rows=1, hidden=64)
    points = [ProfilePoint(key=f"k{i}", op=op, seconds=1e-6, host_ref_s=r) for i, r in enumerate(refs)]
    got = fastest_ref(points)
    assert got is not None and min(refs) <= got <= max(refs)
    below = sum(r < got for r in refs)
    assert below <= HOST_REF_QUANTILE * len(refs)  # at most the quantile's share is faster
    assert fastest_ref([p.model_copy(update={"host_ref_s": None}) for p in points]) is None


def test_finish_profile_takes_the_fastest_reference_and_scales_the_aten_issue_time() -> None:
    launch = Gemm(id=0, m=1, n=1, k=1)
    norms = [SweepPoint(Norm(id=0, rows=r, hidden=64), "n") for r in (1, 2, 4)]
    sps = [SweepPoint(launch, "launch", tag="launch"), *norms]

    def measured(sp: SweepPoint) -> ProfilePoint:
        """Every point but the launch one measured fast; the launch point (aten issue time) slow."""
        slow = sp.tag == "launch"
        return ProfilePoint(
            key=sp.key, op=sp.op, seconds=1e-6, tag=sp.tag,
            host_s=15e-6 if slow else 10e-6, host_ref_s=SLOW_REF if slow else FAST_REF,
        )  # fmt: skip

    pts = {sp.key: measured(sp) for sp in sps}
    prof = finish_profile(sps, pts, set(pts), ProfileDevice(name="x"), sweep_timing("cpu"))
    assert prof.host_ref_us == pytest.approx(FAST_REF * 1e6)
    assert prof.aten_issue_us == pytest.approx(15.0 * FAST_REF / SLOW_REF)  # 9.75 us, not the slow 15
    assert not any("host ran slower" in n for n in prof.notes)  # 3 of 4 points fast: no drift to tell
    # One point of four met the host fast: the median reference is the slow one, and the notes say so.
    drifting = {k: p if k == sps[1].key else p.model_copy(update={"host_ref_s": SLOW_REF}) for k, p in pts.items()}
    drifted = finish_profile(sps, drifting, set(pts), ProfileDevice(name="x"), sweep_timing("cpu"))
    assert any("host ran slower than its fastest" in n and "6.5 us" in n for n in drifted.notes), drifted.notes
    old = finish_profile(
        sps, {k: p.model_copy(update={"host_ref_s": None}) for k, p in pts.items()}, set(pts),
        ProfileDevice(name="x"), sweep_timing("cpu"),
    )  # fmt: skip
    assert old.host_ref_us is None and old.aten_issue_us == pytest.approx(15.0)


def test_the_profile_model_prices_host_time_as_the_fast_host_whatever_the_sweep_met() -> None:
    """Two sweeps of one host, one quiet throughout and one slow for half its points, give the
    same host time per op; without the reference the slow half moves the medians."""
    hw = load_hardware("h100")
    quiet = [p.model_copy(update={"host_ref_s": FAST_REF}) for p in [*gemm_points(hw), *norm_points(hw)]]
    drifting = _slowed(quiet)
    gemm, norm = Gemm(id=0, m=64, n=4096, k=4096), Norm(id=0, rows=64, hidden=4096)
    costs = {}
    for name, pts in (("quiet", quiet), ("drifting", drifting)):
        ref = fastest_ref(pts)
        assert ref is not None
        prof = synthetic_profile(hw, pts, host_ref_us=ref * 1e6)
        model = ProfileModel(prof)
        costs[name] = [model.estimate(op, hw).host_s for op in (gemm, norm)]
    assert costs["drifting"] == pytest.approx(costs["quiet"])
    assert costs["quiet"] == pytest.approx([30e-6, 50e-6])
    unscaled = ProfileModel(synthetic_profile(hw, [p.model_copy(update={"host_ref_s": None}) for p in drifting]))
    assert unscaled.estimate(norm, hw).host_s > 55e-6  # the slow points' medians: what the reference removes
