"""Typed statistics of a simulated run, and of an engine-count sweep."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field

from opgraph.ir import Scalar
from opgraph.ir.tensor import FrozenModel
from opgraph.ir.timeline import NonNegFloat
from simulators.config import HostConfig
from simulators.kernel import KernelResult
from simulators.problem import SchedulingProblem

Fraction = Annotated[float, Field(ge=0, le=1.0000001)]


class EngineStats(FrozenModel):
    """Work done by one engine (one track)."""

    track: str
    """Track name (``compute0``, ``rank1/link0``)."""
    group: str
    """Engine group."""
    rank: int
    """Tensor-parallel rank."""
    ops: int
    """Ops it ran."""
    busy_us: NonNegFloat
    """Time its ops occupied it (longer than their time alone where ops running at once on other
    engines shared the device with them)."""
    utilization: Fraction
    """``busy_us / makespan_us``."""


class Breakdown(FrozenModel):
    """Ops and device time of one kind, layer or stage (rank 0)."""

    ops: int
    """Ops in this class (free ops included)."""
    busy_us: NonNegFloat
    """Sum of their durations."""
    share: Fraction
    """Fraction of all ops' device time."""


class CriticalPathStats(FrozenModel):
    """The longest chain of dependent ops by device time (rank 0, host not included)."""

    length_us: NonNegFloat
    """Sum of durations along the path: no schedule on any number of engines is shorter."""
    share: Fraction
    """``length_us / makespan_us``: near 1, more engines cannot help."""
    ops: tuple[int, ...]
    """Op ids along the path, first to last."""


class HostStats(FrozenModel):
    """The host thread that issues ops (rank 0)."""

    mode: str
    """``eager``, ``cuda_graph`` or ``none``."""
    per_op_us: NonNegFloat
    """Host time per op with a kernel."""
    busy_us: NonNegFloat
    """Host time spent issuing."""
    issue_end_us: NonNegFloat
    """When the host issued the last op."""
    sync_points: int
    """Times the host waited for the device."""
    host_bound_us: NonNegFloat
    """Time no engine was busy while the host was still issuing: the device waited for launches."""
    host_bound_share: Fraction
    """``host_bound_us / makespan_us``."""


class UncostedOpStats(FrozenModel):
    """An op the cost model declined; simulated as free only with ``skip_uncosted``."""

    op_id: int
    kind: str
    definition: str
    reason: str


class SimulationStats(FrozenModel):
    """What a simulated run achieved: makespan, per-engine utilisation, critical path, breakdowns."""

    reads_unversioned: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    """Format version; the loader refuses newer versions with a clear message and reads a file without one
    (written before it was kept) as version 1."""
    makespan_us: NonNegFloat
    """From time zero to the end of the last op on any rank."""
    serial_us: NonNegFloat
    """Sum of op durations on rank 0: the makespan of one engine with no host cost."""
    speedup: NonNegFloat
    """``serial_us / makespan_us``: the parallelism the schedule found."""
    ops: int
    """Ops in the graph."""
    engine_ops: int
    """Ops that ran on an engine (per rank)."""
    free_ops: int
    """Ops that occupy no engine (views, and skipped uncosted ops)."""
    ranks: int
    """Tensor-parallel ranks simulated."""
    policy: str
    """Scheduling policy."""
    engines: tuple[EngineStats, ...]
    """Every engine of every rank."""
    by_kind: dict[str, Breakdown]
    """Device time by op kind."""
    by_layer: dict[str, Breakdown]
    """Device time by transformer layer (``none`` outside the layers)."""
    by_stage: dict[str, Breakdown]
    """Device time by stage (``none`` when unknown)."""
    critical_path: CriticalPathStats
    """Longest dependent chain."""
    host: HostStats
    """The host thread."""
    collective_wait_us: tuple[NonNegFloat, ...] = ()
    """Per rank: time its collectives waited for the other ranks and for a link."""
    uncosted: tuple[UncostedOpStats, ...] = ()
    """Ops the cost model declined."""
    skipped_uncosted: bool = False
    """The run went on with the uncosted ops as free ops."""
    config: dict[str, Scalar] = Field(default_factory=dict)
    """Settings of the run (as in the timeline's source)."""
    notes: tuple[str, ...] = ()
    """Adjustments the simulator made (engine caps, assumed ranks)."""

    def mean_utilization(self, group: str, rank: int = 0) -> float:
        """Mean utilisation of the engines of ``group`` (``compute``) on ``rank``; 0 when it has none."""
        engines = [e for e in self.engines if e.group == group and e.rank == rank]
        return sum(e.utilization for e in engines) / len(engines) if engines else 0.0


class SweepPoint(FrozenModel):
    """One engine count of a sweep."""

    engines: int
    makespan_us: NonNegFloat
    speedup: NonNegFloat
    """Serial time over makespan."""
    utilization: Fraction
    """Mean utilisation of the compute engines."""


class EngineSweep(FrozenModel):
    """Makespan against the number of compute engines, and the smallest count near the best."""

    reads_unversioned: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    """Format version; the loader refuses newer versions with a clear message and reads a file without one
    (written before it was kept) as version 1."""
    points: tuple[SweepPoint, ...]
    best_makespan_us: NonNegFloat
    tolerance: NonNegFloat
    """Relative slack: counts within ``best * (1 + tolerance)`` are as good as the best."""
    recommended: int
    """Smallest engine count whose makespan is within the tolerance of the best."""
    critical_path_us: NonNegFloat
    """Lower bound no engine count can beat."""


def _breakdown(labels: list[str], dur: np.ndarray, total: float) -> dict[str, Breakdown]:
    uniq, inv = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)
    counts = np.bincount(inv, minlength=len(uniq))
    busy = np.bincount(inv, weights=dur, minlength=len(uniq))
    out: dict[str, Breakdown] = {}
    for k in np.argsort(-busy, kind="stable"):
        b = float(busy[k])
        out[str(uniq[k])] = Breakdown(ops=int(counts[k]), busy_us=b, share=b / total if total > 0 else 0.0)
    return out


def host_bound_us(start: np.ndarray, end: np.ndarray, host_end: float) -> float:
    """Time in ``[0, host_end]`` covered by no interval ``[start, end)``."""
    if host_end <= 0:
        return 0.0
    if start.size == 0:
        return host_end
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    cover_end = np.maximum.accumulate(e)
    prev = np.concatenate(([0.0], cover_end[:-1]))
    gaps = np.clip(np.minimum(s, host_end) - prev, 0.0, None)
    tail = max(0.0, host_end - float(cover_end[-1]))
    return float(gaps.sum()) + tail


def compute_stats(
    kernel: KernelResult,
    problem: SchedulingProblem,
    *,
    host: HostConfig,
    policy: str,
    host_per_op_us: float,
    config: Mapping[str, Scalar],
    notes: Sequence[str] = (),
) -> SimulationStats:
    """Statistics of a finished run: ``kernel`` ran ``problem`` with ``policy`` and host settings
    ``host`` (``host_per_op_us`` per op); ``config`` and ``notes`` are carried into the statistics."""
    k = kernel
    pb = problem
    makespan = k.makespan_us
    tracks = len(k.tracks)
    busy = np.zeros(tracks)
    nops = np.zeros(tracks, dtype=np.int64)
    for rec in k.ranks:
        t = np.asarray(rec.track, dtype=np.int64)
        d = np.asarray(rec.dur_us, dtype=float)
        on = t >= 0
        busy += np.bincount(t[on], weights=d[on], minlength=tracks)
        nops += np.bincount(t[on], minlength=tracks)
    engines = tuple(
        EngineStats(
            track=k.tracks[i],
            group=k.track_group[i],
            rank=k.track_rank[i],
            ops=int(nops[i]),
            busy_us=float(busy[i]),
            utilization=min(1.0, float(busy[i]) / makespan) if makespan > 0 else 0.0,
        )
        for i in range(tracks)
    )
    r0 = k.ranks[0]
    # Device time of an op is its time alone: sharing the device with other ops stretched its span
    # (``dur_us``) but did not add work.
    dur0 = np.asarray(r0.alone_us, dtype=float)
    total = float(dur0.sum())
    ops = pb.ops
    kinds = [op.kind.value for op in ops]
    layers = ["none" if op.layer is None else str(op.layer) for op in ops]
    stages = ["none" if op.stage is None else op.stage.value for op in ops]
    cp_len, cp_path = pb.critical_path(r0.alone_us)
    ids = [op.id for op in ops]
    tr0 = np.asarray(r0.track, dtype=np.int64)
    on0 = tr0 >= 0
    st0 = np.asarray(r0.start_us, dtype=float)
    issue = np.asarray(r0.issue_us, dtype=float)
    host_end = float(issue.max()) if issue.size else 0.0
    took0 = np.asarray(r0.dur_us, dtype=float)
    hb = host_bound_us(st0[on0], st0[on0] + took0[on0], host_end)
    return SimulationStats(
        makespan_us=makespan,
        serial_us=total,
        speedup=total / makespan if makespan > 0 else 0.0,
        ops=len(pb),
        engine_ops=int(on0.sum()),
        free_ops=int((~on0).sum()),
        ranks=len(k.ranks),
        policy=policy,
        engines=engines,
        by_kind=_breakdown(kinds, dur0, total),
        by_layer=_breakdown(layers, dur0, total),
        by_stage=_breakdown(stages, dur0, total),
        critical_path=CriticalPathStats(
            length_us=cp_len,
            share=min(1.0, cp_len / makespan) if makespan > 0 else 0.0,
            ops=tuple(ids[i] for i in cp_path),
        ),
        host=HostStats(
            mode=host.mode.value,
            per_op_us=host_per_op_us,
            busy_us=float(sum(k.host_us)),
            issue_end_us=host_end,
            sync_points=max(0, len(k.host_segments) - 1),
            host_bound_us=hb,
            host_bound_share=min(1.0, hb / makespan) if makespan > 0 else 0.0,
        ),
        collective_wait_us=tuple(k.collective_wait_us),
        uncosted=tuple(
            UncostedOpStats(op_id=u.op_id, kind=u.kind, definition=u.definition, reason=u.reason) for u in pb.uncosted
        ),
        skipped_uncosted=bool(pb.uncosted),
        config=dict(config),
        notes=tuple(notes),
    )
