"""Sweeps on other machines and hours: host times of a host whose speed drifts, scaled to the host at its
fastest by the reference call timed beside each point (``ProfilePoint.host_ref_s``,
``DeviceProfile.issue_s``); and sweeps of one device pooled (``validators.profile.pool_profiles``,
``opgraph profile --pool``)."""

from __future__ import annotations

from pathlib import Path

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


def _passes_point(key: str, op: Norm, times: tuple[float, ...], host_s: float) -> ProfilePoint:
    return ProfilePoint(key=key, op=op, seconds=sorted(times)[len(times) // 2], passes=times, host_s=host_s)


def test_pooled_sweeps_take_every_measured_time_and_the_first_sweeps_host() -> None:
    from validators.configs import config_key
    from validators.profile import pool_profiles

    device = ProfileDevice(name="GPU", hardware="h100-sxm")
    a_op, b_op = Norm(id=0, rows=8, hidden=4096), Norm(id=0, rows=64, hidden=4096)
    first = DeviceProfile(
        device=device,
        aten_issue_us=10.0,
        points=(
            _passes_point(config_key(a_op), a_op, (1e-5, 1.2e-5, 1.1e-5), 20e-6),
            # A key stored before a rename: the op decides which point it is.
            ProfilePoint(key="stale-key-of-b", op=b_op, seconds=3e-5, host_s=25e-6),
        ),
    )
    second = DeviceProfile(
        device=device.model_copy(update={"date": "later"}),
        aten_issue_us=14.0,
        points=(
            _passes_point(config_key(a_op), a_op, (0.9e-5, 1.3e-5, 1.0e-5), 30e-6),
            ProfilePoint(key=config_key(b_op), op=b_op, seconds=3.2e-5, host_s=35e-6),
        ),
    )
    pooled = pool_profiles([first, second])
    by_op = {p.op.rows: p for p in pooled.points}  # type: ignore[union-attr]
    assert len(pooled.points) == 2
    assert by_op[8].passes == (1e-5, 1.2e-5, 1.1e-5, 0.9e-5, 1.3e-5, 1.0e-5)
    assert by_op[8].seconds == pytest.approx(1.05e-5)  # the median of all six
    assert by_op[64].key == config_key(b_op) and by_op[64].seconds == pytest.approx(3.1e-5)
    assert [p.host_s for p in pooled.points] == [20e-6, 25e-6] and pooled.aten_issue_us == 10.0
    assert "pooled from 2 sweeps" in pooled.notes[-1]


def test_cli_pools_profiles_and_refuses_another_devices(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hardware import load_profile
    from opgraph.cli.app import app

    hw = load_hardware("h100")
    a = synthetic_profile(hw, hardware="h100-sxm").save(tmp_path / "a.profile.json")
    b = synthetic_profile(hw, hardware="h100-sxm").save(tmp_path / "b.profile.json")
    other = synthetic_profile(hw, hardware="h200").save(tmp_path / "c.profile.json")
    out = tmp_path / "pooled.profile.json"
    r = CliRunner().invoke(app, ["profile", "--pool", str(a), "--pool", str(b), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert all(len(p.passes) == 2 for p in load_profile(out).points)
    r = CliRunner().invoke(app, ["profile", "--pool", str(a), "--pool", str(other), "-o", str(out)])
    assert r.exit_code == 2 and "among profiles of" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["profile", "--pool", str(a), "--plan"])
    assert r.exit_code == 2 and "--pool measures nothing" in r.output
