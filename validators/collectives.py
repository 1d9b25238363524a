"""Collective benchmark: time NCCL (or gloo) collectives over message and group sizes, or replay a graph's.

Under ``torchrun --nproc-per-node N`` every rank runs the same ordered list of cases in lockstep.
A case is one collective (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
``broadcast``) of ``bytes`` per rank over the first ``group_size`` ranks (sub-groups made with
``new_group``; the other ranks wait). ``bytes`` follows :class:`opgraph.ir.Collective`: the input
buffer of one rank (the shard for an all-gather, the whole buffer for a reduce-scatter).

On CUDA (NCCL) a call's time is the duration of the NCCL kernels it launched, read from
torch.profiler (each call in its own profiler range; the median over back-to-back calls), with
CUDA events around each call as a cross-check. On the CPU (gloo, for tests) it is the wall-clock
time of the blocking call. Rank 0 streams one :class:`CollectiveMeasurement` per case to JSONL;
``resume`` skips cases already in the file.

An NCCL kernel starts when its rank launches it and spins until every peer's kernel has started,
so a rank's kernel time is the transfer plus the wait for the last peer. With the hosts launching
call by call, the wait is the host skew between ranks (about 100 us per call under the profiler
on the first 4 x H100 run, whatever the size). Two things keep it out of the transfer time:

- **GPU lead**: on CUDA every rank queues a GPU sleep of ``lead_us`` before its timed calls, so
  the calls pile up behind it and run back to back, paced by the GPUs, not by the hosts; the first
  call (which absorbs the skew of the sleeps' ends) is not timed;
- **every rank timed**: each rank's per-call times are gathered; a call's transfer time is the
  shortest of the ranks' (the last rank to arrive waits for nobody), its wait on a rank the
  difference. :attr:`CollectiveMeasurement.transfer_us` (what the fit uses) and ``wait_us`` keep
  them apart; ``median_us`` stays rank 0's own time.

Run it as::

    torchrun --standalone --nproc-per-node 4 -m validators.collectives --sizes 4K..1G --points 15 \\
        --out collectives.jsonl
    torchrun --standalone --nproc-per-node 2 -m validators.collectives --graph sharded.json.gz --out g.jsonl

or through the CLI, which also shards a graph on the fly (``opgraph calibrate --collectives`` fits the
result)::

    torchrun --standalone --nproc-per-node 4 -m opgraph replay --collectives --device cuda --sizes 4K..1G \
        --points 15 -o collectives.jsonl
    torchrun --standalone --nproc-per-node 2 -m opgraph replay --collectives --device cuda --tp 2 graph.json.gz \
        -o graph_collectives.jsonl

:func:`fit_collectives <hardware.collective_fit.fit_collectives>` turns the measurements into
alpha-beta parameters.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

from pydantic import Field, ValidationError

from hardware.collective_fit import measurement_lines
from opgraph.ir import Collective, CollectiveKind, DType, OpGraph, OpgraphError, OpKind, collective_definition
from opgraph.ir.ops import PosInt
from opgraph.ir.tensor import FrozenModel
from opgraph.ir.timeline import NonNegFloat

__all__ = [
    "BENCHMARKED",
    "CALL_RANGE",
    "CollectiveBenchError",
    "CollectiveBenchmark",
    "CollectiveCase",
    "CollectiveJob",
    "CollectiveMeasurement",
    "CollectiveTimer",
    "collective_cases",
    "format_measurement",
    "graph_cases",
    "kernels_per_call",
    "load_measurements",
    "main",
    "parse_size",
    "parse_sizes",
    "power_of_two_groups",
    "run_cases",
    "run_collective_job",
    "split_wait",
    "sweep_cases",
]


BENCHMARKED: tuple[CollectiveKind, ...] = (
    CollectiveKind.ALL_REDUCE,
    CollectiveKind.ALL_GATHER,
    CollectiveKind.REDUCE_SCATTER,
    CollectiveKind.ALL_TO_ALL,
    CollectiveKind.BROADCAST,
)
"""Collectives this module can run (``send_recv`` is point-to-point, not benchmarked here)."""

CALL_RANGE = "opgraph.collective"
"""Name of the profiler range around each timed call."""

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}  # fmt: skip


class CollectiveBenchError(OpgraphError):
    """A collective benchmark request that cannot be run as given."""


class CollectiveTimer(str, Enum):
    """How a call was timed."""

    NCCL_KERNELS = "nccl_kernels"
    """Sum of the durations of the NCCL kernels the call launched (torch.profiler, CUPTI)."""
    CUDA_EVENTS = "cuda_events"
    """Elapsed time between CUDA events recorded around the call on the current stream."""
    WALL = "wall"
    """Host wall-clock time of the blocking call (gloo on the CPU)."""


class _CollectiveIdentity:
    """What a case and its measurement share: the key that pairs them and the graph's definition name."""

    if TYPE_CHECKING:
        collective: CollectiveKind
        bytes: int
        group_size: int
        dtype: DType

    @property
    def key(self) -> tuple[str, int, int, str]:
        """Identity of the (measured) case: (collective, bytes, group size, dtype)."""
        return (self.collective.value, self.bytes, self.group_size, self.dtype.value)

    @property
    def definition(self) -> str:
        """The graph's definition name of this collective (``all_reduce_g4_b65536``)."""
        return collective_definition(self.collective, self.group_size, self.bytes)


class CollectiveCase(_CollectiveIdentity, FrozenModel):
    """One collective to time: what, how many bytes per rank, over how many ranks, in which dtype."""

    collective: CollectiveKind
    bytes: PosInt
    """Payload per rank: the input buffer of one rank (as :attr:`opgraph.ir.Collective.bytes`)."""
    group_size: Annotated[int, Field(ge=2)]
    """Ranks taking part (the first ``group_size`` of the job)."""
    dtype: DType = DType.bf16
    uses: PosInt = 1
    """How often the replayed graph runs this case (1 for a sweep)."""


class CollectiveMeasurement(_CollectiveIdentity, FrozenModel):
    """The measured time of one :class:`CollectiveCase` on one job (written by rank 0)."""

    collective: CollectiveKind
    bytes: PosInt
    """Payload per rank actually used (the input buffer; rounded down to whole elements per rank)."""
    group_size: Annotated[int, Field(ge=2)]
    dtype: DType
    median_us: NonNegFloat
    """Median time of one call, microseconds (by :attr:`timer`)."""
    iqr_us: NonNegFloat
    """Interquartile range of the samples, microseconds."""
    samples: PosInt
    """Calls timed."""
    timer: CollectiveTimer
    events_median_us: NonNegFloat | None = None
    """Cross-check on CUDA: median of CUDA-event timings of the same calls, microseconds."""
    attribution: str = "range"
    """How kernels were tied to calls: ``range`` (profiler ranges), ``order`` (kernels in launch
    order, split evenly over the calls) or ``wall``."""
    uses: PosInt = 1
    """How often the replayed graph runs this case (1 for a sweep)."""
    transfer_us: NonNegFloat | None = None
    """Median over the calls of the shortest rank's time of the call: the transfer, no waiting."""
    transfer_iqr_us: NonNegFloat | None = None
    """Interquartile range of those per-call transfer times."""
    wait_us: NonNegFloat | None = None
    """Median over the calls of the ranks' mean time beyond the shortest one (waiting for peers)."""
    ranks_timed: PosInt | None = None
    """Ranks whose per-call times were gathered (the case's group)."""
    lead_us: NonNegFloat = 0.0
    """GPU sleep queued before the timed calls on every rank, microseconds (0: none, host-paced)."""
    world_size: PosInt
    rank: Annotated[int, Field(ge=0)] = 0
    """The rank whose timings these are (rank 0, a member of every group)."""
    backend: str
    """``nccl`` or ``gloo``."""
    device_name: str
    torch_version: str
    nccl_version: str = ""
    created: str
    """UTC time of the measurement, ISO 8601."""

    @property
    def algbw_gbps(self) -> float:
        """Algorithm bandwidth in GB/s, by nccl-tests' convention (the all-gather's size is its output)."""
        size = self.bytes * (self.group_size if self.collective is CollectiveKind.ALL_GATHER else 1)
        return size / (self.median_us * 1e-6) / 1e9 if self.median_us > 0 else math.inf


# ---------------------------------------------------------------- sizes and cases
def parse_size(text: str) -> int:
    """Bytes of a size written ``4096``, ``4K``, ``64KiB``, ``1M``, ``1G`` (binary units).

    >>> parse_size("4K"), parse_size("1 GiB"), parse_size("100")
    (4096, 1073741824, 100)
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else ""
    if m is None or unit not in _UNITS:
        raise CollectiveBenchError(
            f"{text!r} is not a size", where="--sizes", hint="write bytes with an optional unit: 4096, 4K, 16M, 1G"
        )
    value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise CollectiveBenchError(f"{text!r} is not a positive size", where="--sizes")
    return value


def parse_sizes(text: str, points: int | None = None, *, align: int = 4096) -> tuple[int, ...]:
    """Message sizes from ``LOW..HIGH`` (powers of two, or ``points`` geometric sizes) or ``a,b,c``.

    Geometric sizes are rounded to a multiple of ``align`` bytes (when above it) so that every
    group size and dtype divides them; duplicates are dropped.

    >>> parse_sizes("4K..64K")
    (4096, 8192, 16384, 32768, 65536)
    >>> parse_sizes("4K..1G", 4)
    (4096, 262144, 16777216, 1073741824)
    >>> parse_sizes("1M, 4K")
    (4096, 1048576)
    """
    if ".." in text:
        lo_s, hi_s = text.split("..", 1)
        lo, hi = parse_size(lo_s), parse_size(hi_s)
        if hi < lo:
            raise CollectiveBenchError(f"empty range {text!r}", where="--sizes", hint="write LOW..HIGH, e.g. 4K..1G")
        if points is None:
            sizes = []
            s = lo
            while s <= hi:
                sizes.append(s)
                s *= 2
        else:
            if points < 2:
                raise CollectiveBenchError(
                    f"{points} points cannot span a range", where="--points", hint="give 2 or more"
                )
            ratio = (hi / lo) ** (1 / (points - 1))
            sizes = [round(lo * ratio**i) for i in range(points)]
            sizes = [s if s <= align else max(align, round(s / align) * align) for s in sizes]
            sizes[-1] = hi
    else:
        sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise CollectiveBenchError("no size given", where="--sizes", hint="e.g. 4K..1G or 4K,1M,64M")
    return tuple(sorted(set(sizes)))


def power_of_two_groups(world_size: int) -> tuple[int, ...]:
    """Group sizes 2, 4, 8, ... up to ``world_size``.

    >>> power_of_two_groups(8), power_of_two_groups(6), power_of_two_groups(1)
    ((2, 4, 8), (2, 4), ())
    """
    out = []
    g = 2
    while g <= world_size:
        out.append(g)
        g *= 2
    return tuple(out)


def sweep_cases(
    collectives: Iterable[CollectiveKind], sizes: Iterable[int], group_sizes: Iterable[int], dtype: DType = DType.bf16
) -> list[CollectiveCase]:
    """Every (collective, group size, size) combination, in that nesting order."""
    sizes = tuple(sizes)
    return [
        CollectiveCase(collective=c, bytes=s, group_size=g, dtype=dtype)
        for c in collectives
        for g in group_sizes
        for s in sizes
    ]


def graph_cases(graph: OpGraph) -> tuple[list[CollectiveCase], list[str]]:
    """The unique collectives of a (sharded) graph, with their uses, and the ones that cannot run.

    Returns ``(cases, skipped)``: ``cases`` in first-use order; ``skipped`` names collectives that
    are not benchmarked (send/recv) or have a group of one rank, with their op ids.
    """
    found: dict[tuple[str, int, int, str], CollectiveCase] = {}
    skipped: list[str] = []
    for op in graph.ops_of(OpKind.COLLECTIVE):
        assert isinstance(op, Collective)
        if op.collective not in BENCHMARKED or op.group_size < 2 or op.bytes < 1:
            skipped.append(f"op {op.id}: {op.definition} ({'not benchmarked' if op.group_size > 1 else 'one rank'})")
            continue
        case = CollectiveCase(collective=op.collective, bytes=op.bytes, group_size=op.group_size, dtype=op.dtype)
        prev = found.get(case.key)
        found[case.key] = case if prev is None else prev.model_copy(update={"uses": prev.uses + 1})
    return list(found.values()), skipped


# ---------------------------------------------------------------- results on disk
def load_measurements(path: str | Path) -> list[CollectiveMeasurement]:
    """Measurements of a JSONL file (a torn last line is ignored; the newest record of a case wins)."""
    p = Path(path)
    lines = measurement_lines(p, CollectiveBenchError)
    out: dict[tuple[str, int, int, str], CollectiveMeasurement] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            m = CollectiveMeasurement.model_validate_json(line)
        except ValidationError as exc:
            if i == len(lines) - 1:
                break  # a crash mid-write
            raise CollectiveBenchError(
                f"line {i + 1} is not a collective measurement ({exc.errors()[0]['msg']})", where=str(p)
            ) from None
        out[m.key] = m
    return list(out.values())


# ---------------------------------------------------------------- statistics
def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _iqr(xs: Sequence[float]) -> float:
    return _quantile(xs, 0.75) - _quantile(xs, 0.25) if len(xs) > 1 else 0.0


def split_wait(per_rank: Sequence[Sequence[float]]) -> tuple[list[float], list[list[float]]] | None:
    """Per-call transfer time and each rank's wait, from every rank's per-call times.

    ``per_rank[r][i]`` is rank ``r``'s time of call ``i``. A collective ends at about the same time
    on every rank, and a rank's kernel starts when that rank launches it, so the rank that launched
    last spent no time waiting: the call's transfer time is the shortest of the ranks' times, and a
    rank's wait is its time beyond it. ``None`` when the ranks timed different numbers of calls.

    >>> split_wait([[50.0, 10.0], [10.0, 40.0]])
    ([10.0, 10.0], [[40.0, 0.0], [0.0, 30.0]])
    """
    if not per_rank or len({len(x) for x in per_rank}) != 1 or not per_rank[0]:
        return None
    transfer = [min(col) for col in zip(*per_rank, strict=True)]
    waits = [[t - m for t, m in zip(xs, transfer, strict=True)] for xs in per_rank]
    return transfer, waits


class TransferSplit(NamedTuple):
    """A case's calls split into transfer and waiting over its group's ranks: the
    :class:`CollectiveMeasurement` fields of the same names (all ``None`` when not known)."""

    transfer_us: float | None = None
    """Median over the calls of the shortest rank's time of the call."""
    transfer_iqr_us: float | None = None
    """Interquartile range of those per-call transfer times."""
    wait_us: float | None = None
    """Median over the calls of the ranks' mean time beyond the shortest one."""
    ranks_timed: int | None = None
    """Ranks whose per-call times were split."""


def transfer_split(per_rank: Sequence[Sequence[float]]) -> TransferSplit:
    """:func:`split_wait`'s per-call transfer and waits summarised, from every rank's per-call times
    (an empty split when the ranks timed different numbers of calls).

    >>> transfer_split([[50.0, 10.0], [10.0, 40.0]])
    TransferSplit(transfer_us=10.0, transfer_iqr_us=0.0, wait_us=17.5, ranks_timed=2)
    """
    split = split_wait(per_rank)
    if split is None:
        return TransferSplit()
    transfer, waits = split
    mean_wait = [statistics.fmean(col) for col in zip(*waits, strict=True)]
    return TransferSplit(statistics.median(transfer), _iqr(transfer), statistics.median(mean_wait), len(per_rank))


def _is_nccl_kernel(name: str) -> bool:
    return "nccl" in name.lower()


def kernels_per_call(events: Iterable[Any], calls: int) -> tuple[list[float], str]:
    """NCCL kernel time of each call, microseconds, from torch.profiler ``FunctionEvent`` objects.

    Each call ran inside a :data:`CALL_RANGE` range; its kernels are those the profiler correlated
    with the range's CPU subtree. If the profiler tied no kernel to the ranges, the NCCL kernels are
    split over the calls in launch order (``order``); returns (per-call times, attribution).
    """
    evs = list(events)
    per_call: list[float] = []
    for e in evs:
        if e.name != CALL_RANGE or getattr(e, "is_async", False) or not _on_cpu(e):
            continue
        total = 0.0
        stack = [e]
        while stack:
            ev = stack.pop()
            total += sum(float(k.duration) for k in getattr(ev, "kernels", ()) if _is_nccl_kernel(k.name))
            stack.extend(getattr(ev, "cpu_children", ()))
        per_call.append(total)
    if len(per_call) == calls and all(x > 0 for x in per_call):
        return per_call, "range"
    kernels = sorted(
        (e for e in evs if not _on_cpu(e) and _is_nccl_kernel(e.name)), key=lambda e: float(e.time_range.start)
    )
    if not kernels:
        return [], "none"
    if len(kernels) % calls == 0:
        k = len(kernels) // calls
        return [
            sum(float(e.time_range.elapsed_us()) for e in kernels[i * k : (i + 1) * k]) for i in range(calls)
        ], "order"
    total = sum(float(e.time_range.elapsed_us()) for e in kernels)
    return [total / calls], "order-mean"


def _on_cpu(e: Any) -> bool:
    dt = getattr(e, "device_type", None)
    return getattr(dt, "name", str(dt)).upper().endswith("CPU")


# ---------------------------------------------------------------- the benchmark
@dataclass
class _Group:
    size: int
    comm: Any
    """Process group the collective runs on (NCCL on CUDA)."""
    sync: Any
    """A gloo group of the same ranks, for host barriers that launch no device kernel."""


@dataclass
class CollectiveBenchmark:
    """Runs :class:`CollectiveCase` s on this process's rank of an initialised torch.distributed job.

    Make it on every rank with the same ``group_sizes`` (sub-groups are created collectively);
    then call :meth:`measure` with the same cases in the same order on every rank.
    """

    group_sizes: Sequence[int]
    warmup: int = 3
    """Untimed calls before each case (the first ones also create NCCL communicators)."""
    repeats: int = 10
    """Timed calls per case."""
    device: str = "cuda"
    events_check: bool = True
    """On CUDA, also time the calls with CUDA events (``events_median_us``)."""
    lead_us: float = 3000.0
    """On CUDA, GPU sleep queued before the timed calls (0: none; the hosts then pace the calls)."""
    _groups: dict[int, _Group] = field(default_factory=dict, init=False, repr=False)
    _cycles_per_us: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise CollectiveBenchError("torch.distributed is not initialised", hint="run under torchrun")
        if self.warmup < 0 or self.repeats < 1:
            raise CollectiveBenchError("warmup must be >= 0 and repeats >= 1", where="--repeats")
        world = dist.get_world_size()
        self.rank = dist.get_rank()
        self.world_size = world
        self.backend = str(dist.get_backend())
        self.world_sync: Any = dist.group.WORLD if self.backend == "gloo" else dist.new_group(backend="gloo")
        """A gloo group of every rank (host barriers)."""
        for g in sorted(set(self.group_sizes)):
            if g < 2 or g > world:
                raise CollectiveBenchError(
                    f"group size {g} does not fit a job of {world} ranks",
                    where="--group-sizes",
                    hint=f"give 2..{world}",
                )
            ranks = list(range(g))
            comm = dist.group.WORLD if g == world else dist.new_group(ranks)
            sync = comm if self.backend == "gloo" else dist.new_group(ranks, backend="gloo")
            self._groups[g] = _Group(g, comm, sync)
        self.device_name = _device_name(self.device)
        self.torch_version, self.nccl_version = _versions(self.device)
        if self.device == "cuda" and self.lead_us > 0:
            self._cycles_per_us = _sleep_rate()

    def measure(self, case: CollectiveCase) -> CollectiveMeasurement | None:
        """Time ``case`` on every rank of its group; rank 0 gets the measurement, the others ``None``
        (ranks outside the group return at once)."""
        group = self._groups.get(case.group_size)
        if group is None:
            raise CollectiveBenchError(
                f"group size {case.group_size} was not set up", where=case.definition, hint="add it to group_sizes"
            )
        if self.rank >= case.group_size:
            return None
        fn, used_bytes = self._make_call(case, group)
        xs, timer, attribution, ev = self._time(fn, group)
        split = self._gather_split(xs, group)
        if self.rank != 0:
            return None
        return CollectiveMeasurement(
            collective=case.collective,
            bytes=used_bytes,
            group_size=case.group_size,
            dtype=case.dtype,
            median_us=statistics.median(xs),
            iqr_us=_iqr(xs),
            samples=len(xs),
            timer=timer,
            events_median_us=ev,
            attribution=attribution,
            uses=case.uses,
            **split._asdict(),
            lead_us=self.lead_us if timer is not CollectiveTimer.WALL and self._cycles_per_us > 0 else 0.0,
            world_size=self.world_size,
            rank=self.rank,
            backend=self.backend,
            device_name=self.device_name,
            torch_version=self.torch_version,
            nccl_version=self.nccl_version,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    def _gather_split(self, xs: Sequence[float], group: _Group) -> TransferSplit:
        """Every rank's per-call times to rank 0, split there (:func:`transfer_split`; empty elsewhere)."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * group.size if self.rank == 0 else []
        dist.gather_object(list(xs), gathered if self.rank == 0 else None, dst=0, group=group.sync)
        if self.rank != 0:
            return TransferSplit()
        return transfer_split([list(g) for g in gathered])

    def _lead(self) -> None:
        """Queue the GPU sleep that lets the timed calls pile up behind it (CUDA, ``lead_us`` > 0)."""
        if self._cycles_per_us > 0:
            import torch

            # Long enough for the host to queue every call behind it (~100 us a call under the profiler).
            lead_us = max(self.lead_us, 200.0 * (self.repeats + 1))
            torch.cuda._sleep(int(lead_us * self._cycles_per_us))  # type: ignore[no-untyped-call]

    def _make_call(self, case: CollectiveCase, group: _Group) -> tuple[Callable[[], Any], int]:
        import torch
        import torch.distributed as dist

        from validators.inputs import torch_dtype

        dtype = torch_dtype(case.dtype)
        item = torch.tensor([], dtype=dtype).element_size()
        g = case.group_size
        numel = case.bytes // item
        if case.collective in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_TO_ALL):
            numel -= numel % g
        if numel < 1:
            raise CollectiveBenchError(
                f"{case.bytes} bytes hold no whole element per rank of {case.dtype.value}", where=case.definition
            )
        dev = torch.device(self.device, torch.cuda.current_device()) if self.device == "cuda" else torch.device("cpu")
        x = torch.ones(numel, dtype=dtype, device=dev)
        comm = group.comm
        c = case.collective
        # Every call must launch the collective, not a no-op: buffers are allocated once per case.
        if c is CollectiveKind.ALL_REDUCE:

            def fn() -> Any:
                return dist.all_reduce(x, group=comm)

        elif c is CollectiveKind.ALL_GATHER:
            out = torch.empty(numel * g, dtype=dtype, device=dev)

            def fn() -> Any:
                return dist.all_gather_into_tensor(out, x, group=comm)

        elif c is CollectiveKind.REDUCE_SCATTER:
            out = torch.empty(numel // g, dtype=dtype, device=dev)

            def fn() -> Any:
                return dist.reduce_scatter_tensor(out, x, group=comm)

        elif c is CollectiveKind.ALL_TO_ALL:
            out = torch.empty_like(x)

            def fn() -> Any:
                return dist.all_to_all_single(out, x, group=comm)

        elif c is CollectiveKind.BROADCAST:

            def fn() -> Any:
                return dist.broadcast(x, src=0, group=comm)

        else:
            raise CollectiveBenchError(f"{c.value} is not benchmarked", where=case.definition)
        return fn, numel * item

    def _time(self, fn: Callable[[], Any], group: _Group) -> tuple[list[float], CollectiveTimer, str, float | None]:
        import torch.distributed as dist

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the *_tensor names are deprecated in new torch
            for _ in range(self.warmup):
                fn()
            if self.device != "cuda":
                xs = []
                for _ in range(self.repeats):
                    dist.barrier(group=group.sync)
                    t0 = time.perf_counter_ns()
                    fn()
                    xs.append((time.perf_counter_ns() - t0) / 1e3)
                return xs, CollectiveTimer.WALL, "wall", None
            return self._time_cuda(fn, group)

    def _time_cuda(
        self, fn: Callable[[], Any], group: _Group
    ) -> tuple[list[float], CollectiveTimer, str, float | None]:
        import torch
        import torch.distributed as dist
        from torch.profiler import ProfilerActivity, profile, record_function

        # Line the ranks up on the host (gloo: no device kernel), queue the GPU lead, then call back
        # to back: the calls pile up behind the lead; the first one absorbs the ranks' skew, untimed.
        lead = 1 if self._cycles_per_us > 0 else 0
        torch.cuda.synchronize()
        dist.barrier(group=group.sync)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            self._lead()
            for _ in range(lead):
                fn()
            for _ in range(self.repeats):
                with record_function(CALL_RANGE):
                    fn()
            torch.cuda.synchronize()
        xs, attribution = kernels_per_call(prof.events(), self.repeats)
        ev: float | None = None
        if self.events_check:
            event = torch.cuda.Event
            starts = [event(enable_timing=True) for _ in range(self.repeats)]  # type: ignore[no-untyped-call]
            ends = [event(enable_timing=True) for _ in range(self.repeats)]  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()
            dist.barrier(group=group.sync)
            self._lead()
            for _ in range(lead):
                fn()
            for s, e in zip(starts, ends, strict=True):
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            ev = statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True))
        if not xs:
            if ev is None:
                raise CollectiveBenchError("the profiler recorded no NCCL kernel", hint="check the CUDA profiler")
            return [ev], CollectiveTimer.CUDA_EVENTS, "events", ev
        return xs, CollectiveTimer.NCCL_KERNELS, attribution, ev


def _sleep_rate() -> float:
    """GPU sleep cycles per microsecond on the current device (``torch.cuda._sleep`` spins cycles)."""
    import torch

    cycles = 2_000_000
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]  # warm the kernel up
    start.record()
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
    end.record()
    end.synchronize()
    us = start.elapsed_time(end) * 1e3
    return cycles / us if us > 0 else 0.0


def _device_name(device: str) -> str:
    import torch

    from validators.inputs import device_name

    dev = torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device(device)
    return device_name(dev)


def _versions(device: str) -> tuple[str, str]:
    import torch

    nccl = ""
    if device == "cuda":
        try:
            v = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            nccl = ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)
        except Exception:  # no NCCL build: the field stays empty
            nccl = ""
    return str(torch.__version__), nccl


def run_cases(
    bench: CollectiveBenchmark,
    cases: Sequence[CollectiveCase],
    out: str | Path | None = None,
    *,
    resume: bool = False,
    on_result: Callable[[CollectiveMeasurement], None] | None = None,
) -> list[CollectiveMeasurement]:
    """Measure ``cases`` on every rank in lockstep; rank 0 appends each result to ``out`` as it comes.

    With ``resume`` the cases already in ``out`` are skipped (every rank reads the file before
    rank 0 writes to it). Returns rank 0's measurements (``[]`` on the other ranks).
    """
    import torch.distributed as dist

    done: set[tuple[str, int, int, str]] = set()
    path = Path(out) if out is not None else None
    if resume and path is not None and path.exists():
        done = {m.key for m in load_measurements(path)}
    todo = [c for c in cases if c.key not in done]
    dist.barrier(group=bench.world_sync)  # nobody writes before every rank has read
    results: list[CollectiveMeasurement] = []
    fh = None
    if path is not None and bench.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = path.open("a" if resume else "w", encoding="utf-8")
    try:
        for case in todo:
            m = bench.measure(case)
            if m is None or bench.rank != 0:
                continue
            results.append(m)
            if fh is not None:
                fh.write(m.model_dump_json() + "\n")
                fh.flush()
            if on_result is not None:
                on_result(m)
    finally:
        if fh is not None:
            fh.close()
    return results


# ---------------------------------------------------------------- command line
def _kinds(text: str) -> tuple[CollectiveKind, ...]:
    if text.strip() == "all":
        return BENCHMARKED
    out = []
    for part in text.split(","):
        name = part.strip().replace("-", "_")
        try:
            kind = CollectiveKind(name)
        except ValueError:
            kind = None
        if kind is None or kind not in BENCHMARKED:
            raise CollectiveBenchError(
                f"unknown collective {part.strip()!r}",
                where="--collectives",
                hint="all, or a list of " + ", ".join(k.value for k in BENCHMARKED),
            )
        out.append(kind)
    return tuple(out)


def _ints(text: str, where: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise CollectiveBenchError(f"{text!r} is not a list of integers", where=where) from None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m validators.collectives",
        description="Time collectives under torchrun (NCCL on CUDA, gloo on the CPU); rank 0 writes JSONL.",
    )
    ap.add_argument("--out", type=Path, required=True, help="JSONL file of CollectiveMeasurement records")
    ap.add_argument("--sizes", default="4K..1G", help="LOW..HIGH (powers of two, or --points) or a list 4K,1M")
    ap.add_argument("--points", type=int, default=None, help="geometric sizes over LOW..HIGH instead of powers of 2")
    ap.add_argument("--collectives", default="all", help="all or a list: " + ",".join(k.value for k in BENCHMARKED))
    ap.add_argument("--group-sizes", default=None, help="list of group sizes (default: powers of two up to N)")
    ap.add_argument("--dtype", default=None, help="bf16 on CUDA, fp32 on the CPU by default")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--graph", type=Path, action="append", default=None, help="replay the collectives of this graph (repeatable)"
    )
    ap.add_argument("--resume", action="store_true", help="skip the cases already in --out")
    ap.add_argument("--no-events", action="store_true", help="skip the CUDA-event cross-check")
    ap.add_argument(
        "--lead-us", type=float, default=3000.0, help="GPU sleep queued before the timed calls (0: host-paced calls)"
    )
    ap.add_argument("-q", "--quiet", action="store_true")
    return ap


UNSHARDED_HINT = "give a graph sharded for TP N (`opgraph replay --collectives --tp N GRAPH` shards it on the fly)"
"""What to do about a graph without collectives (the CLI shards; this module does not import transforms)."""


def collective_cases(
    graphs: Sequence[tuple[str, OpGraph]],
    world: int,
    *,
    sizes: str = "4K..1G",
    points: int | None = None,
    collectives: str = "all",
    group_sizes: Sequence[int] | None = None,
    dtype: DType = DType.bf16,
    warn: Callable[[str], None] | None = None,
) -> list[CollectiveCase]:
    """The cases of a job of ``world`` ranks: the collectives of ``graphs`` (``(label, graph)`` pairs,
    merged with their uses), or, without graphs, the sweep of ``collectives`` over ``sizes`` and
    ``group_sizes`` (default: powers of two up to ``world``).

    Raises :class:`CollectiveBenchError` on a graph without collectives, one whose groups need more
    ranks than the job has, bad sizes or names, or a job with no group to benchmark.
    """
    if graphs:
        merged: dict[tuple[str, int, int, str], CollectiveCase] = {}
        for label, graph in graphs:
            if not graph.ops_of(OpKind.COLLECTIVE):
                raise CollectiveBenchError("the graph has no collective", where=label, hint=UNSHARDED_HINT)
            cases, skipped = graph_cases(graph)
            for s in skipped:
                (warn or (lambda m: print(m, file=sys.stderr)))(f"skipped: {label}: {s}")
            too_big = [c for c in cases if c.group_size > world]
            if too_big:
                raise CollectiveBenchError(
                    f"the graph's {too_big[0].definition} needs {too_big[0].group_size} ranks, the job has {world}",
                    where=label,
                    hint=f"run with --nproc-per-node {too_big[0].group_size}",
                )
            for c in cases:
                prev = merged.get(c.key)
                merged[c.key] = c if prev is None else prev.model_copy(update={"uses": prev.uses + c.uses})
        return list(merged.values())
    groups = tuple(group_sizes) if group_sizes else power_of_two_groups(world)
    if not groups:
        raise CollectiveBenchError(
            f"a job of {world} rank(s) has no group to benchmark", hint="run under torchrun --nproc-per-node 2 or more"
        )
    return sweep_cases(_kinds(collectives), parse_sizes(sizes, points), groups, dtype)


@dataclass(frozen=True)
class CollectiveJob:
    """What :func:`run_collective_job` measured (rank 0 holds the results; other ranks none)."""

    results: list[CollectiveMeasurement]
    rank: int
    world_size: int
    device: str
    """``cuda`` or ``cpu``."""
    device_name: str


def run_collective_job(
    out: str | Path,
    *,
    graphs: Sequence[tuple[str, OpGraph]] = (),
    sizes: str = "4K..1G",
    points: int | None = None,
    collectives: str = "all",
    group_sizes: Sequence[int] | None = None,
    dtype: DType | str | None = None,
    device: str = "auto",
    warmup: int = 3,
    repeats: int = 10,
    resume: bool = False,
    events_check: bool = True,
    lead_us: float = 3000.0,
    on_result: Callable[[CollectiveMeasurement], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> CollectiveJob:
    """One collective benchmark job on this rank of a torchrun launch (``WORLD_SIZE`` >= 2).

    Checks the request before starting any process group, initialises NCCL (CUDA) or gloo (CPU),
    measures :func:`collective_cases` with :func:`run_cases` (rank 0 streams them to ``out``) and
    tears the group down. ``dtype`` defaults to bf16 on CUDA and fp32 on the CPU.
    """
    import torch
    import torch.distributed as dist

    if not graphs:  # bad sizes or names fail before anything starts
        parse_sizes(sizes, points)
        _kinds(collectives)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        raise CollectiveBenchError("needs 2 or more ranks", hint="run under torchrun --nproc-per-node N")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise CollectiveBenchError(f"unknown device {device!r}", where="--device", hint="cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise CollectiveBenchError("CUDA is not available here", where="--device", hint="use --device cpu")
    try:
        dt = DType(dtype) if dtype else (DType.bf16 if device == "cuda" else DType.fp32)
    except ValueError:
        raise CollectiveBenchError(f"unknown dtype {dtype!r}", where="--dtype", hint="bf16, fp16, fp32") from None
    cases = collective_cases(
        graphs, world, sizes=sizes, points=points, collectives=collectives, group_sizes=group_sizes, dtype=dt,
        warn=warn,
    )  # fmt: skip
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")
    try:
        groups = sorted({c.group_size for c in cases})
        bench = CollectiveBenchmark(
            groups, warmup=warmup, repeats=repeats, device=device, events_check=events_check, lead_us=lead_us
        )
        results = run_cases(bench, cases, out, resume=resume, on_result=on_result)
        return CollectiveJob(results, bench.rank, bench.world_size, device, bench.device_name)
    finally:
        dist.destroy_process_group()


def format_measurement(m: CollectiveMeasurement) -> str:
    """One line per measured case: time, spread, the CUDA-event cross-check, transfer and wait, algbw."""
    ev = f"  events {m.events_median_us:9.1f}" if m.events_median_us is not None else ""
    if m.transfer_us is not None:
        ev += f"  transfer {m.transfer_us:9.1f} wait {m.wait_us or 0.0:8.1f}"
    return (
        f"{m.collective.value:<15} g{m.group_size} {m.bytes:>12} B  {m.median_us:9.1f} us "
        f"(iqr {m.iqr_us:.1f}){ev}  algbw {m.algbw_gbps:7.2f} GB/s"
    )


def _run(args: argparse.Namespace) -> int:
    from opgraph.ir import load_graph

    graphs = [(str(p), load_graph(p)) for p in args.graph or ()]

    def show(m: CollectiveMeasurement) -> None:
        if not args.quiet:
            print(format_measurement(m), flush=True)

    job = run_collective_job(
        args.out, graphs=graphs, sizes=args.sizes, points=args.points, collectives=args.collectives,
        group_sizes=_ints(args.group_sizes, "--group-sizes") if args.group_sizes else None, dtype=args.dtype,
        device=args.device, warmup=args.warmup, repeats=args.repeats, resume=args.resume,
        events_check=not args.no_events, lead_us=args.lead_us, on_result=show,
    )  # fmt: skip
    if job.rank == 0:
        print(json.dumps({"measured": len(job.results), "out": str(args.out), "device": job.device_name}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (under torchrun); bad input is one line on stderr and exit code 2."""
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except OpgraphError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
