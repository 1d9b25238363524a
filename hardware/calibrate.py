"""Calibration: fit a :class:`~hardware.models.table.CostTable` from measured op times.

Input is a list of :class:`Measurement` (an op, its median device time, optionally its host issue
time), usually from replay results (``opgraph calibrate replay.jsonl``). The fit is deliberately
simple and inspectable:

- every measured config becomes a table entry (exact lookups; other shapes of the same definition
  are interpolated by the table model);
- the fallback roofline gets a per-kind ``time_scale``: the median ratio of measured time to the
  uncalibrated roofline's estimate over that kind's measurements, so unmeasured shapes and
  definitions inherit what the device really does;
- the launch latency is refitted from launch-bound ops (those the roofline thinks take under half a
  microsecond of work) when there are at least three of them;
- the eager host overhead per op is the median measured host issue time, and each entry keeps its
  own host time so the simulator charges every op what it measured.

Host overhead can also be fitted from a measured trace (:func:`host_overhead_from_trace`): the
median interval between consecutive kernel launches of one CPU thread, over host-bound stretches.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hardware.models.efficiency import RooflineParams
from hardware.models.roofline import RooflineModel
from hardware.models.table import CostTable, TableEntry, shape_key
from hardware.spec import HardwareSpec
from opgraph.ir import OpBase, OpgraphError, OpKind, Scalar, Timeline

LAUNCH_BOUND_WORK_S = 0.5e-6
"""Ops whose roofline work time is under this are taken as launch-bound when refitting the launch latency."""


class CalibrationError(OpgraphError):
    """Calibration cannot proceed (no usable measurements, measurements from another device)."""


@dataclass(frozen=True)
class Measurement:
    """One measured op: its median device time and, when known, its host issue time."""

    op: OpBase
    seconds: float
    host_seconds: float | None = None
    spread_s: float = 0.0
    samples: int = 1


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def _entries(measurements: Sequence[Measurement]) -> tuple[TableEntry, ...]:
    groups: dict[tuple[str, str, tuple[tuple[str, int], ...]], list[Measurement]] = defaultdict(list)
    for m in measurements:
        groups[(m.op.definition, m.op.dtype.value, tuple(sorted(shape_key(m.op).items())))].append(m)
    out = []
    for ms in groups.values():
        hosts = [m.host_seconds for m in ms if m.host_seconds is not None]
        out.append(
            TableEntry.from_op(
                ms[0].op,
                _median([m.seconds for m in ms]),
                spread_s=_median([m.spread_s for m in ms]),
                samples=sum(m.samples for m in ms),
                host_seconds=_median(hosts) if hosts else None,
            )
        )
    return tuple(out)


def fit_cost_table(
    measurements: Iterable[Measurement],
    hardware: HardwareSpec,
    *,
    source: dict[str, Scalar] | None = None,
    host_overhead_us: float | None = None,
) -> CostTable:
    """Fit a cost table for ``hardware`` from ``measurements``.

    ``host_overhead_us`` (e.g. from :func:`host_overhead_from_trace`) overrides the eager host
    overhead fitted from the measurements' host times.
    """
    ms = [m for m in measurements if m.seconds > 0 and math.isfinite(m.seconds) and m.op.kind is not OpKind.VIEW]
    if not ms:
        raise CalibrationError(
            "no usable measurements (no op with a positive, finite time)",
            hint="replay a graph first: opgraph replay GRAPH --device cuda -o replay.jsonl",
        )
    notes: list[str] = []
    base = RooflineModel()
    work = [(m, base.estimate(m.op, hardware)) for m in ms]
    launch_bound = [m.seconds for m, c in work if max(c.compute_s, c.memory_s) < LAUNCH_BOUND_WORK_S]
    launch_us = hardware.launch_latency_us
    if len(launch_bound) >= 3:
        launch_us = _median(launch_bound) * 1e6
        notes.append(f"launch latency {launch_us:.2f} us: median of {len(launch_bound)} launch-bound ops")
    params = RooflineParams(launch_latency_us=launch_us)
    refit = RooflineModel(params)
    ratios: dict[OpKind, list[float]] = defaultdict(list)
    for m in ms:
        est = refit.estimate(m.op, hardware).seconds
        if est > 0:
            ratios[m.op.kind].append(m.seconds / est)
    scale = {kind: _median(r) for kind, r in ratios.items() if r}
    for kind, value in sorted(scale.items(), key=lambda kv: kv[0].value):
        notes.append(f"{kind.value}: roofline x{value:.3f} (median of {len(ratios[kind])} ops)")
    params = params.model_copy(update={"time_scale": scale})
    hosts = [m.host_seconds for m in ms if m.host_seconds is not None]
    eager_us = hardware.host.eager_us
    if host_overhead_us is not None:
        eager_us = host_overhead_us
        notes.append(f"host overhead {eager_us:.2f} us/op: from a measured trace")
    elif hosts:
        eager_us = _median(hosts) * 1e6
        notes.append(f"host overhead {eager_us:.2f} us/op: median measured issue time of {len(hosts)} configs")
    hw = hardware.model_copy(
        update={"launch_latency_us": launch_us, "host": hardware.host.model_copy(update={"eager_us": eager_us})}
    )
    return CostTable(
        hardware=hw,
        entries=_entries(ms),
        roofline=params,
        source={"measurements": len(ms), **(source or {})},
        notes=tuple(notes),
    )


def host_overhead_from_trace(timeline: Timeline, *, max_gap_us: float = 1000.0) -> float:
    """Median interval (us) between consecutive kernel launches on one CPU thread of a measured trace.

    Intervals over ``max_gap_us`` (synchronisations, idle time) are left out. Raises
    :class:`CalibrationError` when the trace has no runtime launch events.
    """
    by_track: dict[str, list[float]] = defaultdict(list)
    for s in timeline.spans:
        if (s.category or "") == "runtime" and "launch" in s.name.lower():
            by_track[s.track].append(s.start_us)
    gaps: list[float] = []
    for starts in by_track.values():
        starts.sort()
        gaps.extend(b - a for a, b in itertools.pairwise(starts) if 0 < b - a <= max_gap_us)
    if not gaps:
        raise CalibrationError(
            "the trace has no kernel-launch runtime events to fit host overhead from",
            where=timeline.source.trace_file or timeline.source.name or None,
            hint="import it with CPU events (not --kernels-only)",
        )
    return _median(gaps)
