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

One line does not follow NCCL over 4 KiB to 1 GiB: NCCL switches protocol (LL for latency-bound
sizes, LL128, then Simple for bandwidth-bound ones) and channel counts with the size, so the
measured curve bends (on 4 x H100 a single line is 7-76% off at the median). What predicts is
therefore piecewise (:attr:`PredictMethod.INTERPOLATE`, the default):

- inside the measured sizes, piecewise alpha-beta: between two measured sizes the time is affine
  in the bytes (the alpha-beta line through the two points: right within one protocol regime, and
  across a regime change better than a power law), after two clean-ups: a size whose calls
  spread by more than ``max_spread`` (interquartile range over median) is left out (its calls
  waited for late peers: waiting only ever adds time), and the times are made non-decreasing in
  size from above (the lower envelope: a time above a larger size's is an upper bound, not a
  transfer time);
- above the largest size, the bandwidth regime: the last point plus the extra bus bytes at the
  bus bandwidth of the largest sizes (:attr:`CollectiveFit.busbw_large_gbps`);
- below the smallest size, the latency regime: from the smallest point down to the latency floor
  (:attr:`CollectiveFit.floor_us`: the smallest size's time when it is latency-bound, else the
  calibration's other collectives' floors), in proportion to the bus bytes.

Each fit reports its own leave-one-out error (each measured size predicted from the others).

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

from hardware.base import Bound, Cost, CostModel, UncostedOpError
from hardware.calibrate import CalibrationError
from hardware.spec import HardwareSpec, NonNegFloat, PosFloat
from opgraph.ir import Collective, CollectiveKind, DType, OpBase, OpgraphError
from opgraph.ir.tensor import FrozenModel

__all__ = [
    "CalibratedCollectiveModel",
    "CollectiveCalibration",
    "CollectiveFit",
    "CollectiveFitError",
    "CollectiveSample",
    "CollectivesCostedApart",
    "FitPoint",
    "HeldOutPoint",
    "PredictMethod",
    "bus_bytes",
    "bus_factor",
    "fit_collectives",
    "fit_line",
    "format_calibration",
    "heldout_errors",
    "load_collective_samples",
    "lower_envelope",
    "main",
    "measurement_lines",
]

LATENCY_BOUND_BYTES = 256 * 1024
"""Sizes up to this many bytes per rank are latency-bound on NVLink: their time is the floor."""
DEFAULT_MAX_SPREAD = 0.10
"""A size whose calls' interquartile range exceeds this fraction of their median waited for peers."""
_LARGE_POINTS = 3
"""Points of the bandwidth regime (the largest kept sizes) its slope is fitted on."""


class CollectiveFitError(CalibrationError):
    """Measurements that cannot be fitted (none, one size only, times that do not grow with size)."""


class PredictMethod(str, Enum):
    """How :meth:`CollectiveCalibration.predict` turns a fit into a time."""

    ALPHA_BETA = "alpha_beta"
    """``alpha + bus_bytes / busbw`` everywhere."""
    INTERPOLATE = "interpolate"
    """Piecewise: the measured points joined by alpha-beta segments inside their sizes, the
    bandwidth regime above them, the latency regime below them (see the module doc)."""


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
    iqr_us: NonNegFloat | None = None
    """Interquartile range of the calls, microseconds, when known (a wide spread means waiting)."""
    dtype: DType = DType.bf16
    device_name: str = ""


class FitPoint(FrozenModel):
    """One measured size of a fit."""

    bytes: Annotated[int, Field(ge=1)]
    """Per-rank input bytes."""
    time_us: PosFloat
    """Measured time (the median when a size was measured more than once)."""


class CollectiveFit(FrozenModel):
    """``t = alpha + bus_bytes / busbw`` for one collective over one group size."""

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
    """Largest relative error of the alpha-beta line over its points (in sample)."""
    median_rel_err: NonNegFloat
    """Median relative error of the alpha-beta line over its points (in sample)."""
    points: tuple[FitPoint, ...]
    """The measured sizes kept, ascending, times non-decreasing (the interpolation's knots)."""
    busbw_large_gbps: PosFloat | None = None
    """Bus bandwidth of the bandwidth regime (the largest sizes), GB/s: the slope above the range."""
    floor_us: NonNegFloat | None = None
    """Latency floor, microseconds: the time the prediction tends to for tiny messages."""
    dropped: tuple[FitPoint, ...] = ()
    """Sizes left out because their calls spread too much (they waited for late peers)."""
    loo_median_rel_err: NonNegFloat | None = None
    """Median relative error of the piecewise prediction at each kept size, fitted without it."""
    loo_max_rel_err: NonNegFloat | None = None
    """Largest such leave-one-out error."""

    def alpha_beta_us(self, nbytes: float) -> float:
        """The alpha-beta time of a call with ``nbytes`` of per-rank input, microseconds."""
        return self.alpha_us + bus_bytes(self.collective, nbytes, self.group_size) / (self.busbw_gbps * 1e3)

    def interpolate_us(self, nbytes: float) -> float:
        """The piecewise prediction: alpha-beta segments between the measured times inside their sizes,
        the bandwidth regime above them and the latency regime below them (see the module doc)."""
        return _piecewise_us(self.collective, self.group_size, self.points, nbytes, self._slope(), self._floor())

    def _slope(self) -> float:
        return 1 / ((self.busbw_large_gbps or self.busbw_gbps) * 1e3)

    def _floor(self) -> float:
        return self.alpha_us if self.floor_us is None else self.floor_us

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


class CollectiveCalibration(FrozenModel):
    """Alpha-beta fits of the collectives measured on one machine, per (collective, group size)."""

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
        except UnicodeDecodeError:
            raise CollectiveFitError(
                "not a collective calibration (not text)",
                where=str(p),
                hint="give the JSON of `calibrate --collectives`",
            ) from None
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
    max_spread: float = DEFAULT_MAX_SPREAD,
) -> CollectiveCalibration:
    """Fit ``alpha`` and ``busbw`` per (collective, group size) of ``samples``.

    ``samples`` are :class:`CollectiveSample` s or objects with the same fields
    (``validators.collectives.CollectiveMeasurement`` has them, with ``median_us`` for ``time_us``).
    Sizes measured more than once count once, at their median. ``link_bandwidth`` (bytes/s, or
    the ``hardware``'s interconnect bandwidth) sets each fit's ``link_efficiency``. With
    ``strict=False`` a (collective, group size) that cannot be fitted is listed in ``skipped``
    instead of failing the whole calibration (but no fit at all is still an error). Sizes whose
    calls spread by more than ``max_spread`` (IQR over median, when the samples carry ``iqr_us``)
    are left out of the fit (see the module doc); a fit whose smallest kept size is not
    latency-bound takes its floor from the median of the other fits' floors.

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
    groups: dict[tuple[CollectiveKind, int], dict[int, list[tuple[float, float | None]]]] = {}
    for p in pts:
        groups.setdefault((p.collective, p.group_size), {}).setdefault(p.bytes, []).append((p.time_us, p.iqr_us))
    fits: list[CollectiveFit] = []
    skipped: list[str] = []
    for (c, g), by_size in sorted(groups.items(), key=lambda kv: (kv[0][0].value, kv[0][1])):
        try:
            fits.append(_fit_one(c, g, by_size, link_bandwidth, max_spread))
        except CollectiveFitError as exc:
            if strict:
                raise
            skipped.append(exc.one_line())
    if not fits:
        raise CollectiveFitError(
            "no (collective, group size) could be fitted", hint="; ".join(skipped) or "measure a range of sizes"
        )
    own = [f.floor_us for f in fits if f.floor_us is not None]
    borrowed = statistics.median(own) if own else None
    fits = [_with_floor_and_loo(f, borrowed) for f in fits]
    names = sorted({p.device_name for p in pts if p.device_name})
    return CollectiveCalibration(
        device_name=", ".join(names),
        link_bandwidth_gbps=link_bandwidth / 1e9 if link_bandwidth else None,
        fits=tuple(fits),
        skipped=tuple(skipped),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _piecewise_us(
    c: CollectiveKind, g: int, pts: Sequence[FitPoint], nbytes: float, slope_us_per_byte: float, floor_us: float
) -> float:
    if not pts:
        return floor_us
    first, last = pts[0], pts[-1]
    if nbytes >= last.bytes:
        return last.time_us + (bus_bytes(c, nbytes, g) - bus_bytes(c, last.bytes, g)) * slope_us_per_byte
    if nbytes <= first.bytes:
        floor = min(floor_us, first.time_us)
        return floor + (first.time_us - floor) * nbytes / first.bytes
    lo, hi = 0, len(pts) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pts[mid].bytes <= nbytes:
            lo = mid
        else:
            hi = mid
    a, b = pts[lo], pts[hi]
    # Affine in the bytes between two knots: each segment is the alpha-beta line through them.
    w = (nbytes - a.bytes) / (b.bytes - a.bytes)
    return a.time_us + w * (b.time_us - a.time_us)


def lower_envelope(points: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """``(bytes, time)`` points ascending in size with each time lowered to the smallest time of
    any larger size: waiting only adds time, so a time above a larger message's is an upper bound.

    >>> lower_envelope([(8, 5.0), (1, 9.0), (4, 3.0), (16, 7.0)])
    [(1, 3.0), (4, 3.0), (8, 5.0), (16, 7.0)]
    """
    out: list[tuple[int, float]] = []
    low = math.inf
    for b, t in sorted(points, reverse=True):
        low = min(low, t)
        out.append((b, low))
    return out[::-1]


def _large_slope(c: CollectiveKind, g: int, pts: Sequence[FitPoint]) -> float | None:
    """us per bus byte of the bandwidth regime (the largest points), ``None`` when it does not grow."""
    top = pts[-_LARGE_POINTS:]
    if len(top) < 2:
        return None
    _, inv = fit_line([bus_bytes(c, p.bytes, g) for p in top], [p.time_us for p in top])
    return inv if inv > 0 else None


def _own_floor(pts: Sequence[FitPoint]) -> float | None:
    return pts[0].time_us if pts and pts[0].bytes <= LATENCY_BOUND_BYTES else None


def _loo_errors(c: CollectiveKind, g: int, pts: Sequence[FitPoint], floor_us: float, slope: float) -> list[float]:
    """Relative error of the piecewise prediction at each point, from the other points only."""
    if len(pts) < 3:
        return []
    errs = []
    for i, p in enumerate(pts):
        rest = [q for j, q in enumerate(pts) if j != i]
        s = _large_slope(c, g, rest) or slope
        f = _own_floor(rest)
        pred = _piecewise_us(c, g, rest, p.bytes, s, floor_us if f is None else f)
        errs.append(abs(pred - p.time_us) / p.time_us)
    return errs


def _fit_one(
    c: CollectiveKind,
    g: int,
    by_size: dict[int, list[tuple[float, float | None]]],
    link_bandwidth: float | None,
    max_spread: float = DEFAULT_MAX_SPREAD,
) -> CollectiveFit:
    where = f"{c.value} over {g} ranks"
    if len(by_size) < 2:
        raise CollectiveFitError(
            f"only one size ({next(iter(by_size))} bytes) measured", where=where, hint="measure two or more sizes"
        )
    sizes = sorted(by_size)
    times = [statistics.median(t for t, _ in by_size[s]) for s in sizes]
    spreads = [[q for _, q in by_size[s] if q is not None] for s in sizes]
    noisy = [bool(q) and statistics.median(q) > max_spread * t for q, t in zip(spreads, times, strict=True)]
    if sum(not n for n in noisy) < 2:
        noisy = [False] * len(sizes)  # too few clean sizes: keep every size rather than none
    kept = [(s, t) for s, t, n in zip(sizes, times, noisy, strict=True) if not n]
    dropped = tuple(FitPoint(bytes=s, time_us=t) for s, t, n in zip(sizes, times, noisy, strict=True) if n)
    xs = [bus_bytes(c, s, g) for s, _ in kept]
    ys = [t for _, t in kept]
    alpha, inv_bw = fit_line(xs, ys)
    if inv_bw <= 0:
        raise CollectiveFitError(
            "the times do not grow with the size, so no bandwidth fits them",
            where=where,
            hint="measure sizes large enough to be bandwidth-bound (1M and more)",
        )
    errs = [abs(alpha + x * inv_bw - t) / t for x, t in zip(xs, ys, strict=True)]
    busbw = 1 / inv_bw / 1e3  # bytes per us -> GB/s
    pts = tuple(FitPoint(bytes=s, time_us=t) for s, t in lower_envelope(kept))
    large = _large_slope(c, g, pts)
    return CollectiveFit(
        collective=c,
        group_size=g,
        alpha_us=alpha,
        busbw_gbps=busbw,
        bus_factor=bus_factor(c, g),
        link_efficiency=busbw * 1e9 / link_bandwidth if link_bandwidth else None,
        max_rel_err=max(errs),
        median_rel_err=statistics.median(errs),
        points=pts,
        busbw_large_gbps=1 / large / 1e3 if large is not None else None,
        floor_us=_own_floor(pts),
        dropped=dropped,
    )


def _with_floor_and_loo(fit: CollectiveFit, borrowed_floor: float | None) -> CollectiveFit:
    """Fill a fit without latency-bound sizes with the other fits' floor; add its leave-one-out errors."""
    floor = fit.floor_us if fit.floor_us is not None else borrowed_floor
    fit = fit.model_copy(update={"floor_us": floor})
    errs = _loo_errors(fit.collective, fit.group_size, fit.points, fit._floor(), fit._slope())
    if not errs:
        return fit
    return fit.model_copy(update={"loo_median_rel_err": statistics.median(errs), "loo_max_rel_err": max(errs)})


def _as_sample(s: object) -> CollectiveSample:
    if isinstance(s, CollectiveSample):
        return s
    if isinstance(s, BaseModel):
        data = s.model_dump()
    elif isinstance(s, dict):
        data = dict(s)
    else:
        keys = ("collective", "group_size", "bytes", "median_us", "iqr_us", "dtype", "transfer_us", "transfer_iqr_us")
        data = {k: getattr(s, k) for k in keys if hasattr(s, k)}
        if hasattr(s, "time_us"):
            data["time_us"] = s.time_us
    if "time_us" in data and "median_us" not in data:
        data["median_us"] = data.pop("time_us")
    if data.get("transfer_us") is not None:
        # A measurement with every rank's kernels: the transfer (the last rank to arrive) is the time.
        data["median_us"] = data["transfer_us"]
        data["iqr_us"] = data.get("transfer_iqr_us")
    try:
        return CollectiveSample.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise CollectiveFitError(f"not a collective measurement: {loc}: {err['msg']}") from None


def measurement_lines(path: str | Path, error: type[OpgraphError] = CollectiveFitError) -> list[str]:
    """The lines of a JSONL file of collective measurements; a file that cannot be read raises ``error``.

    (Bytes that are not UTF-8 raise :class:`UnicodeDecodeError`, for the caller to name.)
    """
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise error(f"cannot read the measurements: {exc.strerror}", where=str(p)) from None


def load_collective_samples(path: str | Path) -> list[CollectiveSample]:
    """The samples of a JSONL file of collective measurements (a torn last line is ignored)."""
    p = Path(path)
    try:
        lines = measurement_lines(p)
    except UnicodeDecodeError:
        raise CollectiveFitError("not collective measurements (not text)", where=str(p)) from None
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


class CollectivesCostedApart:
    """A cost model that costs collectives with one model (a measured fit) and every other op with another.

    ``simulate --tp N --collective-fit FIT`` and ``benchmarks/gpu/tp_predict.py`` wrap their compute
    cost model in it. A collective the ``collectives`` model declines (a group size the fit lacks)
    is costed by ``base`` instead, and named in :attr:`declined` so a front end can say so.
    """

    def __init__(self, base: CostModel, collectives: CostModel) -> None:
        self.base = base
        self.collectives = collectives
        self.name = f"{getattr(base, 'name', type(base).__name__)}+measured collectives"
        self.declined: dict[str, str] = {}
        """Collectives (definition name) costed by ``base`` because ``collectives`` declined them, with why."""

    def estimate(self, op: OpBase, hw: HardwareSpec) -> Cost:
        """The collectives model's cost for a collective (``base``'s when it declines), else ``base``'s."""
        if not isinstance(op, Collective):
            return self.base.estimate(op, hw)
        try:
            return self.collectives.estimate(op, hw)
        except UncostedOpError as exc:
            self.declined[op.definition] = exc.message
            return self.base.estimate(op, hw)


class HeldOutPoint(FrozenModel):
    """One measured size predicted by a fit that did not see it."""

    collective: CollectiveKind
    group_size: int
    bytes: int
    measured_us: PosFloat
    predicted_us: NonNegFloat

    @property
    def rel_err(self) -> float:
        """``|predicted / measured - 1|``."""
        return abs(self.predicted_us / self.measured_us - 1)


def heldout_errors(
    samples: Iterable[CollectiveSample | object], *, max_spread: float = DEFAULT_MAX_SPREAD
) -> list[HeldOutPoint]:
    """Fit on the even-indexed sizes of each (collective, group size), predict the odd-indexed ones.

    Only held-out sizes whose own calls spread by at most ``max_spread`` are scored (a size that
    waited for late peers measured waiting, not the collective); the fit drops such sizes itself.
    """
    pts = [_as_sample(s) for s in samples]
    by_key: dict[tuple[CollectiveKind, int], list[CollectiveSample]] = {}
    for p in pts:
        by_key.setdefault((p.collective, p.group_size), []).append(p)
    train: list[CollectiveSample] = []
    test: list[CollectiveSample] = []
    for group in by_key.values():
        sizes = sorted({p.bytes for p in group})
        even = set(sizes[0::2])
        for p in group:
            (train if p.bytes in even else test).append(p)
    cal = fit_collectives(train, strict=False, max_spread=max_spread)
    out: list[HeldOutPoint] = []
    for p in test:
        if p.iqr_us is not None and p.iqr_us > max_spread * p.time_us:
            continue
        try:
            pred = cal.predict(p.collective, p.bytes, p.group_size) * 1e6
        except CollectiveFitError:
            continue
        out.append(HeldOutPoint(collective=p.collective, group_size=p.group_size, bytes=p.bytes,
                                measured_us=p.time_us, predicted_us=pred))  # fmt: skip
    return out


def format_calibration(cal: CollectiveCalibration) -> str:
    """A table of the fits: collective, ranks, the alpha-beta line (alpha, bus bandwidth, link
    efficiency, its in-sample errors), the bandwidth regime's bus bandwidth, the latency floor,
    sizes kept / dropped and the piecewise prediction's leave-one-out errors."""
    lines = [
        f"{'collective':<15} {'ranks':>5} {'alpha_us':>9} {'busbw_GB/s':>10} {'eff':>6} {'line_max':>8} "
        f"{'line_med':>8} {'bw_large':>8} {'floor_us':>8} {'kept':>5} {'loo_med':>8} {'loo_max':>8}"
    ]

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    for f in cal.fits:
        eff = f"{f.link_efficiency:.2f}" if f.link_efficiency is not None else "-"
        large = "-" if f.busbw_large_gbps is None else f"{f.busbw_large_gbps:.1f}"
        floor = "-" if f.floor_us is None else f"{f.floor_us:.2f}"
        kept = f"{len(f.points)}/{len(f.points) + len(f.dropped)}"
        lines.append(
            f"{f.collective.value:<15} {f.group_size:>5} {f.alpha_us:>9.2f} {f.busbw_gbps:>10.1f} {eff:>6} "
            f"{f.max_rel_err:>8.1%} {f.median_rel_err:>8.1%} {large:>8} {floor:>8} {kept:>5} "
            f"{pct(f.loo_median_rel_err):>8} {pct(f.loo_max_rel_err):>8}"
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
    ap.add_argument("--max-spread", type=float, default=DEFAULT_MAX_SPREAD, help="drop sizes with IQR/median above")
    ap.add_argument("--heldout", action="store_true", help="also fit even-indexed sizes and score the odd ones")
    args = ap.parse_args(argv)
    try:
        samples = [s for p in args.measurements for s in load_collective_samples(p)]
        hw = None
        if args.hardware:
            from hardware.loader import load_hardware

            hw = load_hardware(args.hardware)
        cal = fit_collectives(samples, hardware=hw, strict=args.strict, max_spread=args.max_spread)
        held = heldout_errors(samples, max_spread=args.max_spread) if args.heldout else []
    except CalibrationError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    print(format_calibration(cal))
    for line in cal.skipped:
        print(f"skipped: {line}")
    if held:
        errs = sorted(h.rel_err for h in held)
        print(f"held out (fit on even-indexed sizes, {len(errs)} clean odd-indexed sizes scored): "
              f"median {statistics.median(errs):.1%}, max {errs[-1]:.1%}")  # fmt: skip
    if args.out is not None:
        cal.save(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
