"""Alpha-beta fit of collectives: recovery of known parameters, a brute-force check, errors, the cost model."""

from __future__ import annotations

import doctest
import itertools
import math
import random
import statistics
from pathlib import Path

import pytest

import hardware.collective_fit as cf
from hardware import AlphaBetaCollectiveModel, load_hardware
from hardware.collective_fit import (
    CalibratedCollectiveModel,
    CollectiveCalibration,
    CollectiveFitError,
    CollectiveSample,
    PredictMethod,
    bus_bytes,
    fit_collectives,
    fit_line,
    load_collective_samples,
)
from opgraph.ir import Collective, CollectiveKind, Gemm

SIZES = [4096 * 4**i for i in range(10)]  # 4 KiB .. 1 GiB
KINDS = [
    CollectiveKind.ALL_REDUCE,
    CollectiveKind.ALL_GATHER,
    CollectiveKind.REDUCE_SCATTER,
    CollectiveKind.ALL_TO_ALL,
    CollectiveKind.BROADCAST,
]


def _wire_bytes(kind: CollectiveKind, nbytes: int, g: int) -> float:
    """Bytes a rank sends in a ring (counted per step, independently of the module's table)."""
    shard = nbytes / g
    if kind is CollectiveKind.ALL_REDUCE:  # reduce-scatter then all-gather: 2 (g-1) steps of a shard
        return 2 * (g - 1) * shard
    if kind is CollectiveKind.ALL_GATHER:  # g-1 steps, each forwarding one input (the input is the shard)
        return (g - 1) * nbytes
    if kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_TO_ALL):  # g-1 shards leave each rank
        return (g - 1) * shard
    return float(nbytes)  # broadcast, pipelined: every byte crosses each link once


def _synthetic(alpha_us: float, busbw_gbps: float, noise: float = 0.0, seed: int = 0) -> list[CollectiveSample]:
    rng = random.Random(seed)
    out = []
    for kind, g in itertools.product(KINDS, (2, 4, 8)):
        for b in SIZES:
            t = alpha_us + _wire_bytes(kind, b, g) / (busbw_gbps * 1e3)
            t *= 1 + rng.uniform(-noise, noise)
            out.append(CollectiveSample(collective=kind, group_size=g, bytes=b, time_us=t))
    return out


def test_doctests() -> None:
    assert doctest.testmod(cf).failed == 0


@pytest.mark.parametrize(("kind", "g"), list(itertools.product(KINDS, (2, 3, 4, 8))))
def test_bus_bytes_match_ring_traffic(kind: CollectiveKind, g: int) -> None:
    assert bus_bytes(kind, 3 * 2**20, g) == pytest.approx(_wire_bytes(kind, 3 * 2**20, g))


@pytest.mark.parametrize(("alpha", "busbw"), [(8.0, 370.0), (25.0, 45.0)])
def test_recovers_known_alpha_beta_within_1pct(alpha: float, busbw: float) -> None:
    cal = fit_collectives(_synthetic(alpha, busbw, noise=0.003, seed=1))
    assert len(cal.fits) == len(KINDS) * 3
    for fit in cal.fits:
        assert fit.alpha_us == pytest.approx(alpha, rel=0.01)
        assert fit.busbw_gbps == pytest.approx(busbw, rel=0.01)
        assert fit.max_rel_err < 0.01


def _objective(xs: list[float], ys: list[float], a: float, b: float) -> float:
    return sum(((a + b * x - y) / y) ** 2 for x, y in zip(xs, ys, strict=True))


def test_fit_line_matches_a_brute_force_search() -> None:
    rng = random.Random(7)
    xs = [float(s) for s in SIZES]
    ys = [(12 + x / 2e5) * (1 + rng.uniform(-0.15, 0.15)) for x in xs]  # 15% noise: the fit is not exact
    a, b = fit_line(xs, ys)
    best = _objective(xs, ys, a, b)
    # Grid search around the truth, independent of the normal equations.
    grid_best = min(
        (_objective(xs, ys, ga, gb), ga, gb)
        for ga in [6 + 0.05 * i for i in range(240)]
        for gb in [b * (0.8 + 0.002 * j) for j in range(200)]
    )
    assert best <= grid_best[0] + 1e-12
    assert a == pytest.approx(grid_best[1], abs=0.06)
    assert b == pytest.approx(grid_best[2], rel=0.003)


def test_fit_line_pins_a_negative_latency_to_zero() -> None:
    xs = [1.0, 2.0, 4.0]
    ys = [0.5, 2.0, 4.0]  # the unconstrained line crosses below zero
    a, b = fit_line(xs, ys)
    assert a == 0.0
    # With a = 0 the best slope minimises sum((b x - y)^2 / y^2): brute force over b.
    grid = min((_objective(xs, ys, 0.0, 0.5 + i * 1e-4), 0.5 + i * 1e-4) for i in range(10000))
    assert b == pytest.approx(grid[1], abs=2e-4)


def test_empty_input_is_a_typed_error() -> None:
    with pytest.raises(CollectiveFitError, match="no measurements"):
        fit_collectives([])


def test_one_size_only_is_a_typed_error_naming_the_collective() -> None:
    one = [CollectiveSample(collective="all_gather", group_size=4, bytes=4096, time_us=t) for t in (9.0, 10.0)]
    with pytest.raises(CollectiveFitError, match="all_gather over 4 ranks: only one size"):
        fit_collectives(one)


def test_times_that_shrink_with_size_are_rejected() -> None:
    pts = [
        CollectiveSample(collective="broadcast", group_size=2, bytes=b, time_us=t) for b, t in ((1e3, 50), (1e6, 10))
    ]
    with pytest.raises(CollectiveFitError, match="do not grow"):
        fit_collectives(pts)


def test_bad_record_is_a_typed_error() -> None:
    with pytest.raises(CollectiveFitError, match="group_size"):
        fit_collectives([{"collective": "all_reduce", "group_size": 1, "bytes": 8, "median_us": 1.0}])


def test_predict_interpolates_inside_and_extrapolates_outside() -> None:
    # Measured times that are not a line (NCCL switches protocols): interpolation follows them.
    pts = [
        CollectiveSample(collective="all_reduce", group_size=2, bytes=b, time_us=t)
        for b, t in ((4096, 10.0), (65536, 12.0), (1 << 20, 30.0), (1 << 24, 120.0))
    ]
    cal = fit_collectives(pts)
    assert cal.predict("all_reduce", 65536, 2) == pytest.approx(12e-6)
    mid = cal.predict("all_reduce", 2**18, 2)  # a fifth of the way in bytes from 64 KiB to 1 MiB
    assert mid == pytest.approx((12.0 + (30.0 - 12.0) * (2**18 - 2**16) / (2**20 - 2**16)) * 1e-6)
    fit = cal.fit_for("all_reduce", 2)
    # Above the range: continuous at the last size, then the bandwidth regime's slope (not the
    # whole-range line, which jumps at the edge: see test_regimes_...).
    assert cal.predict("all_reduce", 1 << 24, 2) == pytest.approx(120e-6)
    extra = bus_bytes("all_reduce", (1 << 30) - (1 << 24), 2) / (fit.busbw_large_gbps * 1e3)  # type: ignore[operator]
    assert cal.predict("all_reduce", 1 << 30, 2) == pytest.approx((120.0 + extra) * 1e-6)
    assert cal.predict("all_reduce", 2**18, 2, PredictMethod.ALPHA_BETA) == pytest.approx(
        fit.alpha_beta_us(2**18) * 1e-6
    )
    with pytest.raises(CollectiveFitError, match=r"measured group sizes: \[2\]"):
        cal.predict("all_reduce", 4096, 8)


def test_params_make_the_alpha_beta_model_reproduce_the_fit() -> None:
    hw = load_hardware("h100")
    cal = fit_collectives(_synthetic(9.0, 300.0), hardware=hw)
    for fit in cal.fits:
        model = AlphaBetaCollectiveModel(**fit.params(hw.launch_latency_us))
        for b in (65536, 1 << 26):
            op = Collective(id=0, collective=fit.collective, bytes=b, group_size=fit.group_size)
            assert model.estimate(op, hw).us == pytest.approx(fit.alpha_beta_us(b), rel=1e-9)
        assert fit.link_efficiency == pytest.approx(300e9 / hw.interconnect.bandwidth)


def test_calibration_round_trips_and_bad_files_are_named(tmp_path: Path) -> None:
    cal = fit_collectives(_synthetic(5.0, 100.0))
    p = tmp_path / "cal.json"
    cal.save(p)
    assert CollectiveCalibration.load(p) == cal
    p.write_text('{"fits": 3}')
    with pytest.raises(CollectiveFitError, match=r"cal\.json"):
        CollectiveCalibration.load(p)


def test_loads_benchmark_jsonl(tmp_path: Path) -> None:
    from validators.collectives import CollectiveMeasurement

    lines = []
    for b in (4096, 1 << 20):
        m = CollectiveMeasurement(
            collective=CollectiveKind.ALL_TO_ALL, bytes=b, group_size=2, dtype="bf16", median_us=5 + b / 1e5,
            iqr_us=0.1, samples=5, timer="nccl_kernels", world_size=2, backend="nccl", device_name="GPU X",
            torch_version="2", created="2026-11-26T00:00:00+00:00",
        )  # fmt: skip
        lines.append(m.model_dump_json())
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join(lines) + "\n" + lines[0][:30])  # a torn last line
    samples = load_collective_samples(p)
    assert [s.time_us for s in samples] == [5 + 4096 / 1e5, 5 + (1 << 20) / 1e5]
    cal = fit_collectives(samples)
    assert cal.device_name == "GPU X"
    fit = cal.fit_for("all_to_all", 2)
    # Two points: the line goes through both.
    assert fit.alpha_beta_us(4096) == pytest.approx(5 + 4096 / 1e5)


def test_calibrated_cost_model() -> None:
    hw = load_hardware("h100")
    model = CalibratedCollectiveModel(fit_collectives(_synthetic(9.0, 300.0)), PredictMethod.ALPHA_BETA)
    op = Collective(id=0, collective=CollectiveKind.ALL_REDUCE, bytes=1 << 24, group_size=4)
    assert model.estimate(op, hw).us == pytest.approx(9.0 + 1.5 * (1 << 24) / 300e3)
    from hardware import UncostedOpError

    with pytest.raises(UncostedOpError):
        model.estimate(Gemm(id=1, m=1, n=1, k=1), hw)
    with pytest.raises(UncostedOpError, match="16 ranks"):
        model.estimate(op.model_copy(update={"group_size": 16}), hw)


def test_non_strict_fit_lists_what_it_skipped() -> None:
    good = _synthetic(9.0, 300.0)[: len(SIZES)]  # all_reduce over 2 ranks
    flat = [
        CollectiveSample(collective="broadcast", group_size=2, bytes=b, time_us=t) for b, t in ((1e3, 50), (1e6, 10))
    ]
    with pytest.raises(CollectiveFitError, match="broadcast over 2 ranks"):
        fit_collectives(good + flat)
    cal = fit_collectives(good + flat, strict=False)
    assert [(f.collective, f.group_size) for f in cal.fits] == [(CollectiveKind.ALL_REDUCE, 2)]
    assert len(cal.skipped) == 1 and "broadcast over 2 ranks" in cal.skipped[0]
    with pytest.raises(CollectiveFitError, match="no \\(collective, group size\\) could be fitted"):
        fit_collectives(flat, strict=False)


def test_fit_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(s.model_dump_json(by_alias=False) for s in _synthetic(9.0, 300.0)[:20]) + "\n")
    out = tmp_path / "fit.json"
    assert cf.main([str(p), "--hardware", "h100", "--out", str(out)]) == 0
    cal = CollectiveCalibration.load(out)
    assert {(f.collective.value, f.group_size) for f in cal.fits} == {("all_reduce", 2), ("all_reduce", 4)}
    assert cf.main([str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


# ---------------------------------------------------------------- regimes, noisy sizes, held-out data
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu" / "h100x4"


def _regimes_us(nbytes: float) -> float:
    """A made-up NCCL-like curve: latency-bound (LL) below 64 KiB, then two bandwidth regimes."""
    bus = 1.5 * nbytes  # all-reduce over 4 ranks
    if nbytes <= 65536:
        return 8.0 + bus / 20e3
    if nbytes <= 1 << 24:
        return 12.0 + bus / 150e3
    return 30.0 + bus / 360e3


def test_regimes_are_followed_where_one_line_is_not() -> None:
    sizes = [4096 * 2**i for i in range(0, 19, 2)]  # 4 KiB .. 1 GiB, every 4x
    pts = [CollectiveSample(collective="all_reduce", group_size=4, bytes=b, time_us=_regimes_us(b)) for b in sizes]
    fit = fit_collectives(pts).fit_for("all_reduce", 4)
    assert fit.median_rel_err > 0.10  # one alpha-beta line misses the curve
    assert fit.busbw_large_gbps == pytest.approx(360.0, rel=1e-6)  # the largest sizes' regime
    # Above the range: the bandwidth regime exactly; below it: towards the smallest time (the floor).
    assert fit.interpolate_us(4 << 30) == pytest.approx(_regimes_us(4 << 30), rel=1e-9)
    assert fit.floor_us == pytest.approx(_regimes_us(4096))
    assert _regimes_us(4096) * 0.95 < fit.interpolate_us(1024) <= _regimes_us(4096)
    # Sizes between the knots (2x off the measured ones), predicted within 10% where a line is not.
    mids = [4096 * 2**i for i in range(1, 18, 2)]
    errs = [abs(fit.interpolate_us(b) / _regimes_us(b) - 1) for b in mids]
    line = [abs(fit.alpha_beta_us(b) / _regimes_us(b) - 1) for b in mids]
    assert statistics.median(errs) < 0.10 < statistics.median(line)
    # Its own leave-one-out error (each size from the others, 16x apart then) beats the line's in-sample one.
    assert fit.loo_median_rel_err is not None and fit.loo_median_rel_err < fit.median_rel_err


def test_sizes_whose_calls_spread_are_dropped_and_times_made_monotone() -> None:
    rows = [(4096, 6.0, 0.1), (65536, 120.0, 60.0), (1 << 20, 9.0, 0.1), (1 << 24, 80.0, 1.0),
            (1 << 26, 75.0, 2.0), (1 << 28, 900.0, 5.0)]  # fmt: skip
    pts = [CollectiveSample(collective="all_gather", group_size=2, bytes=b, time_us=t, iqr_us=q) for b, t, q in rows]
    fit = fit_collectives(pts).fit_for("all_gather", 2)
    assert [p.bytes for p in fit.dropped] == [65536]  # waited for a late peer: IQR half the median
    # 80 us at 16 MiB is above 64 MiB's 75 us: an upper bound, lowered to it.
    assert [(p.bytes, p.time_us) for p in fit.points] == [
        (4096, 6.0),
        (1 << 20, 9.0),
        (1 << 24, 75.0),
        (1 << 26, 75.0),
        (1 << 28, 900.0),
    ]
    # Without spreads nothing can be told apart: every size is kept.
    bare = [CollectiveSample(collective="all_gather", group_size=2, bytes=b, time_us=t) for b, t, _ in rows]
    assert len(fit_collectives(bare).fit_for("all_gather", 2).points) == len(rows)


def test_a_fit_without_small_sizes_borrows_the_others_floor() -> None:
    small = [CollectiveSample(collective="broadcast", group_size=2, bytes=b, time_us=4.0 + b / 3e5)
             for b in (4096, 1 << 20, 1 << 28)]  # fmt: skip
    big = [
        CollectiveSample(collective="all_gather", group_size=2, bytes=b, time_us=b / 2.5e5) for b in (1 << 26, 1 << 28)
    ]
    cal = fit_collectives(small + big)
    assert cal.fit_for("all_gather", 2).floor_us == pytest.approx(cal.fit_for("broadcast", 2).floor_us)
    assert cal.predict("all_gather", 4096, 2) * 1e6 == pytest.approx(4.0 + 4096 / 3e5, rel=0.05)


def test_measurements_with_every_ranks_kernels_fit_the_transfer_time() -> None:
    rec = {"collective": "all_reduce", "group_size": 2, "bytes": 4096, "median_us": 90.0, "iqr_us": 40.0,
           "transfer_us": 6.0, "transfer_iqr_us": 0.2}  # fmt: skip
    s = cf._as_sample(rec)
    assert (s.time_us, s.iqr_us) == (6.0, 0.2)


@pytest.mark.skipif(not (RESULTS / "collectives.jsonl").is_file(), reason="the 4 x H100 sweep is not checked out")
def test_held_out_sizes_of_the_h100_sweep_are_predicted_within_10pct() -> None:
    """Fit on the even-indexed sizes of the committed 4 x H100 sweep, predict the odd-indexed ones."""
    samples = load_collective_samples(RESULTS / "collectives.jsonl")
    held = cf.heldout_errors(samples)
    # Every (collective, group size) is scored, on sizes across the range.
    assert {(h.collective, h.group_size) for h in held} == {(s.collective, s.group_size) for s in samples}
    assert len(held) >= 30 and min(h.bytes for h in held) < 65536 and max(h.bytes for h in held) > 1 << 28
    assert statistics.median(h.rel_err for h in held) <= 0.10
    # The old method (one alpha-beta line through every size) on the same split does worse.
    cal = fit_collectives([s for s in samples if s.bytes in _even_sizes(samples)], max_spread=math.inf)
    old = [abs(cal.predict(h.collective, h.bytes, h.group_size, PredictMethod.ALPHA_BETA) * 1e6 / h.measured_us - 1)
           for h in held]  # fmt: skip
    assert statistics.median(h.rel_err for h in held) < statistics.median(old)


def _even_sizes(samples: list[CollectiveSample]) -> set[int]:
    out: set[int] = set()
    for key in {(s.collective, s.group_size) for s in samples}:
        sizes = sorted({s.bytes for s in samples if (s.collective, s.group_size) == key})
        out.update(sizes[0::2])
    return out


@pytest.mark.skipif(not (RESULTS / "collectives.jsonl").is_file(), reason="the 4 x H100 sweep is not checked out")
def test_leave_one_out_error_of_the_h100_sweep_is_within_5pct() -> None:
    cal = fit_collectives(load_collective_samples(RESULTS / "collectives.jsonl"))
    loo = [f.loo_median_rel_err for f in cal.fits]
    assert all(x is not None for x in loo)
    assert statistics.median(x for x in loo if x is not None) <= 0.05


def test_unreadable_or_binary_samples_are_one_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(cf.CollectiveFitError, match="cannot read the measurements") as info:
        cf.load_collective_samples(tmp_path)  # a folder, not a file
    assert info.value.where == str(tmp_path)
    binary = tmp_path / "samples.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(cf.CollectiveFitError, match="not collective measurements"):
        cf.load_collective_samples(binary)
