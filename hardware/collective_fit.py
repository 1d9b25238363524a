"""Fit alpha-beta parameters of collectives from measurements, by nccl-tests' bus-bandwidth convention.

nccl-tests (``doc/PERF.md``) reports, for a collective of ``size`` bytes taking ``t`` seconds,
``algbw = size / t`` and ``busbw = algbw x factor`` with the factor that makes ``busbw`` comparable
to the link's peak whatever the collective and the number of ranks ``n``:

============== ================== ==========================================
collective     factor             ``size`` (from a rank's input of ``bytes``)
============== ================== ==========================================
all_reduce     2 (n-1)/n          bytes
all_gather     (n-1)/n            n x bytes (the gathered output)
reduce_scatter (n-1)/n            bytes (the input that is scattered)
all_to_all     (n-1)/n            bytes
broadcast      1                  bytes
============== ================== ==========================================

So ``bus_bytes = size x factor`` is what each rank moves over its link, and one collective of one
group size follows ``t = alpha + bus_bytes / busbw``: ``alpha`` is the latency (launch plus the
algorithm's steps), ``busbw`` the bus bandwidth it reaches. :func:`fit_collectives` fits both per
(collective, group size) by least squares on the relative error (a 4 KiB message weighs as much as
a 1 GiB one), with ``alpha >= 0``.

Mapping onto :mod:`hardware.models.collective` (``AlphaBetaCollectiveModel``): its ring time is
``steps x latency + bytes_multiplier x bytes / (bandwidth x link_efficiency) + launch``, and its
``bytes_multiplier x bytes`` equals ``bus_bytes`` here for every collective. Hence, per
(collective, group size): ``bandwidth x link_efficiency = busbw`` and
``steps x latency_us + launch_latency_us = alpha_us``; :meth:`CollectiveFit.params` gives the
``CollectiveParams`` values that make that model reproduce a fit exactly.

>>> pts = [CollectiveSample(collective="all_reduce", group_size=4, bytes=b, time_us=10 + 1.5 * b / 300e3)
...        for b in (4096, 1 << 20, 1 << 28)]
>>> fit = fit_collectives(pts).fit_for("all_reduce", 4)
>>> round(fit.alpha_us, 3), round(fit.busbw_gbps, 3)
(10.0, 300.0)
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hardware.base import Bound, Cost, UncostedOpError
from hardware.calibrate import CalibrationError
from hardware.spec import HardwareSpec
from opgraph.ir import Collective, CollectiveKind, DType, OpBase
from opgraph.ir.tensor import FROZEN

__all__ = [
    "CalibratedCollectiveModel",
    "CollectiveCalibration",
    "CollectiveFit",
    "CollectiveFitError",
    "CollectiveSample",
    "FitPoint",
    "PredictMethod",
    "bus_bytes",
    "bus_factor",
    "fit_collectives",
    "fit_line",
    "format_calibration",
    "load_collective_samples",
    "main",
]

PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


class CollectiveFitError(CalibrationError):
    """Measurements that cannot be fitted (none, one size only, times that do not grow with size)."""


class PredictMethod(str, Enum):
    """How :meth:`CollectiveCalibration.predict` turns a fit into a time."""

    ALPHA_BETA = "alpha_beta"
    """``alpha + bus_bytes / busbw`` everywhere."""
    INTERPOLATE = "interpolate"
    """Log-log interpolation between the measured sizes inside their range, alpha-beta outside."""


def bus_factor(collective: CollectiveKind | str, group_size: int) -> float:
    """nccl-tests' bus-bandwidth factor of ``collective`` over ``group_size`` ranks.

    >>> bus_factor("all_reduce", 4), bus_factor("all_gather", 4), bus_factor("broadcast", 8)
    (1.5, 0.75, 1.0)
    """
    c = CollectiveKind(collective)
    n = group_size
    if n < 2:
        raise CollectiveFitError(
            f"a group of {n} rank(s) has no bus traffic", where="group_size", hint="give 2 or more"
        )
    if c is CollectiveKind.ALL_REDUCE:
        return 2 * (n - 1) / n
    if c in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_TO_ALL):
        return (n - 1) / n
    if c in (CollectiveKind.BROADCAST, CollectiveKind.SEND_RECV):
        return 1.0
    raise CollectiveFitError(f"no bus factor for {c.value}", where="collective")  # pragma: no cover


def bus_bytes(collective: CollectiveKind | str, nbytes: float, group_size: int) -> float:
    """Bytes one rank moves over its link for a collective whose per-rank input is ``nbytes``.

    ``nbytes`` follows :attr:`opgraph.ir.Collective.bytes` (an all-gather's input is the shard,
    so its nccl-tests size is ``group_size x nbytes``).

    >>> bus_bytes("all_gather", 1000, 4), bus_bytes("all_reduce", 1000, 4)
    (3000.0, 1500.0)
    """
    c = CollectiveKind(collective)
    size = nbytes * group_size if c is CollectiveKind.ALL_GATHER else nbytes
    return size * bus_factor(c, group_size)


class CollectiveSample(BaseModel):
    """One measured collective: what, per-rank input bytes, ranks, time of one call.

    Reads a ``validators.collectives.CollectiveMeasurement`` record too (``median_us`` is taken as
    ``time_us``; other fields are ignored).
    """

    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True, populate_by_name=True)

    collective: CollectiveKind
    group_size: Annotated[int, Field(ge=2)]
    bytes: Annotated[int, Field(ge=1)]
    """Per-rank input buffer, bytes (as :attr:`opgraph.ir.Collective.bytes`)."""
    time_us: PosFloat = Field(validation_alias="median_us")
    """Time of one call, microseconds."""
    dtype: DType = DType.bf16
    device_name: str = ""


class FitPoint(BaseModel):
    """One measured size of a fit."""

    model_config = FROZEN

    bytes: Annotated[int, Field(ge=1)]
    """Per-rank input bytes."""
    time_us: PosFloat
    """Measured time (the median when a size was measured more than once)."""


class CollectiveFit(BaseModel):
    """``t = alpha + bus_bytes / busbw`` for one collective over one group size."""

    model_config = FROZEN

    collective: CollectiveKind
    group_size: Annotated[int, Field(ge=2)]
    alpha_us: NonNegFloat
    """Latency: the time of an empty message, microseconds."""
    busbw_gbps: PosFloat
    """Bus bandwidth, GB/s (1e9 bytes/s), by nccl-tests' convention."""
    bus_factor: PosFloat
    """nccl-tests' factor for this collective and group size (``busbw = algbw x factor``)."""
    link_efficiency: PosFloat | None = None
    """``busbw`` over the link's per-direction bandwidth, when the calibration was given one."""
    max_rel_err: NonNegFloat
    """Largest relative error of the fit over its points."""
    median_rel_err: NonNegFloat
    """Median relative error of the fit over its points."""
    points: tuple[FitPoint, ...]
    """The measured sizes, ascending (for interpolation and plots)."""

    def alpha_beta_us(self, nbytes: float) -> float:
        """The alpha-beta time of a call with ``nbytes`` of per-rank input, microseconds."""
        return self.alpha_us + bus_bytes(self.collective, nbytes, self.group_size) / (self.busbw_gbps * 1e3)

    def interpolate_us(self, nbytes: float) -> float:
        """Log-log interpolation of the measured times; alpha-beta outside the measured sizes."""
        pts = self.points
        if len(pts) < 2 or nbytes <= pts[0].bytes or nbytes >= pts[-1].bytes:
            if pts and (nbytes == pts[0].bytes or nbytes == pts[-1].bytes):
                return (pts[0] if nbytes == pts[0].bytes else pts[-1]).time_us
            return self.alpha_beta_us(nbytes)
        lo, hi = 0, len(pts) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if pts[mid].bytes <= nbytes:
                lo = mid
            else:
                hi = mid
        a, b = pts[lo], pts[hi]
        w = (math.log(nbytes) - math.log(a.bytes)) / (math.log(b.bytes) - math.log(a.bytes))
        return math.exp(math.log(a.time_us) + w * (math.log(b.time_us) - math.log(a.time_us)))

    def params(self, launch_latency_us: float = 0.0) -> dict[str, float | str | bool]:
        """``CollectiveParams`` values with which ``AlphaBetaCollectiveModel`` reproduces this fit.

        Ring algorithm, ``bandwidth`` = busbw (bytes/s) at ``link_efficiency`` 1, and the latency
        per ring step that, with the device's launch latency, adds up to ``alpha``.
        """
        steps = _ring_steps(self.collective, self.group_size)
        per_step = max(self.alpha_us - launch_latency_us, 0.0) / steps
        return {
            "algorithm": "ring",
            "bandwidth": self.busbw_gbps * 1e9,
            "link_efficiency": 1.0,
            "latency_us": per_step,
            "include_launch": launch_latency_us > 0,
        }


def _ring_steps(collective: CollectiveKind, g: int) -> int:
    if collective is CollectiveKind.ALL_REDUCE:
        return 2 * (g - 1)
    if collective is CollectiveKind.SEND_RECV:
        return 1
    return g - 1


class CollectiveCalibration(BaseModel):
    """Alpha-beta fits of the collectives measured on one machine, per (collective, group size)."""

    model_config = FROZEN

    schema_version: Literal[1] = 1
    device_name: str = ""
    """The device the measurements ran on (from the samples)."""
    link_bandwidth_gbps: PosFloat | None = None
    """The per-direction link bandwidth efficiencies are relative to (the hardware spec's), GB/s."""
    fits: tuple[CollectiveFit, ...]
    skipped: tuple[str, ...] = ()
    """(collective, group size) pairs left out by a non-strict fit, with the reason."""
    created: str = ""
    """UTC time of the fit, ISO 8601."""

    def fit_for(self, collective: CollectiveKind | str, group_size: int) -> CollectiveFit:
        """The fit of ``collective`` over ``group_size`` ranks.

        Raises :class:`CollectiveFitError` naming the measured group sizes when there is none.
        """
        c = CollectiveKind(collective)
        for f in self.fits:
            if f.collective is c and f.group_size == group_size:
                return f
        have = sorted(f.group_size for f in self.fits if f.collective is c)
        raise CollectiveFitError(
            f"no fit for {c.value} over {group_size} ranks",
            where="calibration",
            hint=f"measured group sizes: {have}" if have else f"{c.value} was not measured",
        )

    def predict(
        self,
        collective: CollectiveKind | str,
        nbytes: float,
        group_size: int,
        method: PredictMethod = PredictMethod.INTERPOLATE,
    ) -> float:
        """Seconds one call takes, for ``nbytes`` of per-rank input over ``group_size`` ranks."""
        if group_size < 2 or nbytes <= 0:
            return 0.0
        fit = self.fit_for(collective, group_size)
        us = fit.alpha_beta_us(nbytes) if method is PredictMethod.ALPHA_BETA else fit.interpolate_us(nbytes)
        return us * 1e-6

    def interconnect_update(self) -> dict[str, float]:
        """Values for a HardwareSpec's ``interconnect``: the best all-reduce bus bandwidth (bytes/s)
        as ``bandwidth`` and its smallest alpha as ``latency_us`` (an upper bound on a step's latency)."""
        ar = [f for f in self.fits if f.collective is CollectiveKind.ALL_REDUCE] or list(self.fits)
        if not ar:
            return {}
        best = max(ar, key=lambda f: f.busbw_gbps)
        return {"bandwidth": best.busbw_gbps * 1e9, "latency_us": min(f.alpha_us for f in ar)}

    def save(self, path: str | Path) -> None:
        """Write the calibration as JSON."""
        Path(path).write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> CollectiveCalibration:
        """Read a calibration written by :meth:`save`."""
        p = Path(path)
        try:
            return cls.model_validate_json(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise CollectiveFitError(f"cannot read the calibration: {exc.strerror}", where=str(p)) from None
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise CollectiveFitError(f"not a collective calibration: {loc}: {err['msg']}", where=str(p)) from None


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``(a, b)`` minimising ``sum(((a + b x - y) / y)^2)`` with ``a >= 0``: the relative-error fit.

    Closed form of the weighted normal equations (weights ``1 / y^2``); when the best ``a`` is
    negative it is pinned to 0 and ``b`` refitted.

    >>> [round(v, 9) for v in fit_line([0, 1, 2], [1, 3, 5])]
    [1.0, 2.0]
    """
    if len(xs) != len(ys) or not xs:
        raise CollectiveFitError("no points to fit")
    if any(y <= 0 for y in ys):
        raise CollectiveFitError("times must be positive")
    w = [1 / (y * y) for y in ys]
    s_w = sum(w)
    s_x = sum(wi * x for wi, x in zip(w, xs, strict=True))
    s_xx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    s_y = sum(wi * y for wi, y in zip(w, ys, strict=True))
    s_xy = sum(wi * x * y for wi, x, y in zip(w, xs, ys, strict=True))
    det = s_w * s_xx - s_x * s_x
    if det <= 0 or len(set(xs)) < 2:
        raise CollectiveFitError("needs at least two different sizes", hint="measure a range of sizes (4K..1G)")
    a = (s_xx * s_y - s_x * s_xy) / det
    b = (s_w * s_xy - s_x * s_y) / det
    if a < 0:
        a, b = 0.0, s_xy / s_xx
    return a, b


def fit_collectives(
    samples: Iterable[CollectiveSample | object],
    *,
    link_bandwidth: float | None = None,
    hardware: HardwareSpec | None = None,
    strict: bool = True,
) -> CollectiveCalibration:
    """Fit ``alpha`` and ``busbw`` per (collective, group size) of ``samples``.

    ``samples`` are :class:`CollectiveSample` s or objects with the same fields
    (``validators.collectives.CollectiveMeasurement`` has them, with ``median_us`` for ``time_us``).
    Sizes measured more than once count once, at their median. ``link_bandwidth`` (bytes/s, or
    the ``hardware``'s interconnect bandwidth) sets each fit's ``link_efficiency``. With
    ``strict=False`` a (collective, group size) that cannot be fitted is listed in ``skipped``
    instead of failing the whole calibration (but no fit at all is still an error).

    Raises
    ------
    CollectiveFitError
        No samples, a (collective, group size) with a single size, or times that do not grow with
        the size (no positive bandwidth fits them).
    """
    pts = [_as_sample(s) for s in samples]
    if not pts:
        raise CollectiveFitError("no measurements to fit", hint="run the collective benchmark first")
    if link_bandwidth is None and hardware is not None and hardware.interconnect.bandwidth > 0:
        link_bandwidth = hardware.interconnect.bandwidth
    groups: dict[tuple[CollectiveKind, int], dict[int, list[float]]] = {}
    for p in pts:
        groups.setdefault((p.collective, p.group_size), {}).setdefault(p.bytes, []).append(p.time_us)
    fits: list[CollectiveFit] = []
    skipped: list[str] = []
    for (c, g), by_size in sorted(groups.items(), key=lambda kv: (kv[0][0].value, kv[0][1])):
        try:
            fits.append(_fit_one(c, g, by_size, link_bandwidth))
        except CollectiveFitError as exc:
            if strict:
                raise
            skipped.append(exc.one_line())
    if not fits:
        raise CollectiveFitError(
            "no (collective, group size) could be fitted", hint="; ".join(skipped) or "measure a range of sizes"
        )
    names = sorted({p.device_name for p in pts if p.device_name})
    return CollectiveCalibration(
        device_name=", ".join(names),
        link_bandwidth_gbps=link_bandwidth / 1e9 if link_bandwidth else None,
        fits=tuple(fits),
        skipped=tuple(skipped),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _fit_one(c: CollectiveKind, g: int, by_size: dict[int, list[float]], link_bandwidth: float | None) -> CollectiveFit:
    where = f"{c.value} over {g} ranks"
    if len(by_size) < 2:
        raise CollectiveFitError(
            f"only one size ({next(iter(by_size))} bytes) measured", where=where, hint="measure two or more sizes"
        )
    sizes = sorted(by_size)
    times = [statistics.median(by_size[s]) for s in sizes]
    xs = [bus_bytes(c, s, g) for s in sizes]
    alpha, inv_bw = fit_line(xs, times)
    if inv_bw <= 0:
        raise CollectiveFitError(
            "the times do not grow with the size, so no bandwidth fits them",
            where=where,
            hint="measure sizes large enough to be bandwidth-bound (1M and more)",
        )
    errs = [abs(alpha + x * inv_bw - t) / t for x, t in zip(xs, times, strict=True)]
    busbw = 1 / inv_bw / 1e3  # bytes per us -> GB/s
    return CollectiveFit(
        collective=c,
        group_size=g,
        alpha_us=alpha,
        busbw_gbps=busbw,
        bus_factor=bus_factor(c, g),
        link_efficiency=busbw * 1e9 / link_bandwidth if link_bandwidth else None,
        max_rel_err=max(errs),
        median_rel_err=statistics.median(errs),
        points=tuple(FitPoint(bytes=s, time_us=t) for s, t in zip(sizes, times, strict=True)),
    )


def _as_sample(s: object) -> CollectiveSample:
    if isinstance(s, CollectiveSample):
        return s
    if isinstance(s, BaseModel):
        data = s.model_dump()
    elif isinstance(s, dict):
        data = dict(s)
    else:
        data = {k: getattr(s, k) for k in ("collective", "group_size", "bytes", "median_us", "dtype") if hasattr(s, k)}
        if hasattr(s, "time_us"):
            data["time_us"] = s.time_us
    if "time_us" in data and "median_us" not in data:
        data["median_us"] = data.pop("time_us")
    try:
        return CollectiveSample.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise CollectiveFitError(f"not a collective measurement: {loc}: {err['msg']}") from None


def load_collective_samples(path: str | Path) -> list[CollectiveSample]:
    """The samples of a JSONL file of collective measurements (a torn last line is ignored)."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CollectiveFitError(f"cannot read the measurements: {exc.strerror}", where=str(p)) from None
    out: list[CollectiveSample] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(_as_sample(json.loads(line)))
        except (json.JSONDecodeError, CollectiveFitError) as exc:
            if i == len(lines) - 1 and isinstance(exc, json.JSONDecodeError):
                break  # a crash mid-write
            raise CollectiveFitError(f"line {i + 1}: {exc}", where=str(p)) from None
    return out


class CalibratedCollectiveModel:
    """A cost model for :class:`~opgraph.ir.Collective` ops from a :class:`CollectiveCalibration`.

    Other ops, and collectives of a group size the calibration lacks, are uncosted (the simulator
    then costs them otherwise and says so).
    """

    name = "collective-calibrated"

    def __init__(self, calibration: CollectiveCalibration, method: PredictMethod = PredictMethod.INTERPOLATE) -> None:
        self.calibration = calibration
        self.method = method

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        """The measured-fit time of the collective ``op``."""
        if not isinstance(op, Collective):
            raise UncostedOpError(f"the calibrated collective model costs only collectives, not {op.kind.value}")
        if op.group_size < 2:
            return Cost(0.0, Bound.FREE, detail="group of one rank: no communication")
        try:
            fit = self.calibration.fit_for(op.collective, op.group_size)
        except CollectiveFitError as exc:
            raise UncostedOpError(exc.message, hint=exc.hint) from None
        seconds = self.calibration.predict(op.collective, op.bytes, op.group_size, self.method)
        bw_s = bus_bytes(op.collective, op.bytes, op.group_size) / (fit.busbw_gbps * 1e9)
        return Cost(
            seconds,
            Bound.LINK if bw_s >= fit.alpha_us * 1e-6 else Bound.LAUNCH,
            memory_s=bw_s,
            efficiency=fit.link_efficiency,
            detail=f"measured {op.collective.value} over {op.group_size} ranks ({self.method.value})",
        )


def format_calibration(cal: CollectiveCalibration) -> str:
    """A table of the fits: collective, ranks, alpha, bus bandwidth, link efficiency, errors."""
    lines = [
        f"{'collective':<15} {'ranks':>5} {'alpha_us':>9} {'busbw_GB/s':>10} {'eff':>6} {'max_err':>8} {'med_err':>8}"
    ]
    for f in cal.fits:
        eff = f"{f.link_efficiency:.2f}" if f.link_efficiency is not None else "-"
        lines.append(
            f"{f.collective.value:<15} {f.group_size:>5} {f.alpha_us:>9.2f} {f.busbw_gbps:>10.1f} {eff:>6} "
            f"{f.max_rel_err:>8.1%} {f.median_rel_err:>8.1%}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hardware.collective_fit MEASUREMENTS.jsonl... [--hardware h100] --out fit.json``."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m hardware.collective_fit", description=main.__doc__)
    ap.add_argument("measurements", nargs="+", type=Path, help="JSONL files of collective measurements")
    ap.add_argument("--hardware", default=None, help="catalog name: link efficiencies relative to its interconnect")
    ap.add_argument("--out", type=Path, default=None, help="write the CollectiveCalibration JSON here")
    ap.add_argument("--strict", action="store_true", help="fail on any (collective, group size) that cannot be fitted")
    args = ap.parse_args(argv)
    try:
        samples = [s for p in args.measurements for s in load_collective_samples(p)]
        hw = None
        if args.hardware:
            from hardware.loader import load_hardware

            hw = load_hardware(args.hardware)
        cal = fit_collectives(samples, hardware=hw, strict=args.strict)
    except CalibrationError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    print(format_calibration(cal))
    for line in cal.skipped:
        print(f"skipped: {line}")
    if args.out is not None:
        cal.save(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
