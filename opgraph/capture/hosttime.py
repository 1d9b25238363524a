"""Host time between ops, measured at capture: what the framework spends before issuing each op.

In eager PyTorch the host issues one op after another; between two kernel launches it runs the
model's Python (module calls, ``forward`` bodies, cache bookkeeping) and dispatches the views and
metadata ops that launch nothing. Replay measures what it takes to issue an op alone; this module
measures the rest, on the capture host, by running the captured phase again:

- under the CPU profiler (its cost per call is small and mostly inside the call), each recorded
  block a profiler range, SDPA on the recorder's fast path as one range; the top-level calls of
  each block are lined up with the recorded events by name, in order;
- per top-level call, the *gap* since the previous one returned (Python between calls) and its own
  time; the profiler's cost per call (a microbenchmark) is taken off every counted gap;
- where the phase cannot run as it is (a value a ``meta`` tensor does not have, answered by the
  recorder's stand-ins) or its profile does not line up with the recording (on real devices some
  kernels run aten ops of their own that the profiler shows and the recorder does not), a Python
  ``TorchDispatchMode`` clock that gives the same stand-ins stamps every aten call instead (a larger
  cost per call, also measured and taken off; ``HostTimingSummary.overhead_source`` says which).

Each graph op gets the gap before its first call plus the gaps and own times of the calls folded
into no op since the op before it (``OpBase.host_gap_us``). Its own calls, and the Python between
them, are not included: replay runs and times them on the target device. The times are those of
the capture host's CPU; capture on the machine (or CPU type) whose host you want to model.
"""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opgraph.capture.phase import CaptureOptions, PreparedModel, run_phase, setup_phase
from opgraph.capture.recorder import meta_stand_in, run_composite
from opgraph.ir.gcpause import paused_gc
from opgraph.ir.graph import HostTimingSummary, capture_settings

if TYPE_CHECKING:
    from opgraph.ir.graph import OpGraph

_SDPA = "scaled_dot_product_attention"


@dataclass(frozen=True)
class HostTiming:
    """Framework host time before each op, from :func:`measure_host_gaps`."""

    gaps_us: dict[int, float]
    """Op id -> host microseconds spent before the op is issued (its own launch excluded)."""
    calls: int
    """Aten calls timed per run (equal to the recorded events)."""
    runs: int
    """Runs whose calls lined up with the recording (the median over them is kept)."""
    clock_overhead_us: float
    """The timer's cost per call, taken off every counted gap."""
    overhead_source: str
    """What timed the calls: the CPU profiler, or a Python clock."""
    host: str
    """The capture host's CPU."""

    @property
    def total_us(self) -> float:
        """Sum over ops."""
        return sum(self.gaps_us.values())


class _Clock(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Stamps every aten call: (gap since the previous call returned, own time), in nanoseconds."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.samples: list[int] = []
        self.targets: list[Any] = []
        self.last = 0
        self.inside = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.inside:
            return func(*args, **(kwargs or {}))
        t0 = time.perf_counter_ns()
        stand_in = meta_stand_in(func, tuple(args))
        out = stand_in[0] if stand_in is not None else func(*args, **(kwargs or {}))
        t1 = time.perf_counter_ns()
        self.samples += (t0 - self.last, t1 - t0)
        self.targets.append(func)
        self.last = t1
        return out

    def composite(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One stamped call for a function the recorder records as one event (SDPA)."""
        t0 = time.perf_counter_ns()
        self.inside += 1
        try:
            out = run_composite(_SDPA, func, args, kwargs)
        finally:
            self.inside -= 1
        t1 = time.perf_counter_ns()
        self.samples += (t0 - self.last, t1 - t0)
        self.targets.append(_SDPA)
        self.last = t1
        return out


class _PhaseRun:
    """Stands in for the recorder in :func:`~opgraph.capture.phase.run_phase`: the same blocks, with
    SDPA on the same fast path as the recorder's and, with a clock, every aten call stamped; without
    one, each block is a profiler range (:data:`BLOCK_RANGE`) and SDPA one range of its own."""

    def __init__(self, clock: _Clock | None = None) -> None:
        self.clock = clock
        self.stage: str | None = None
        self.step: int | None = None

    @contextmanager
    def recording(self) -> Iterator[_PhaseRun]:
        import torch.nn.functional as F
        from torch.profiler import record_function

        clock = self.clock
        original = F.scaled_dot_product_attention

        def sdpa(*args: Any, **kwargs: Any) -> Any:
            if clock is not None:
                return clock.composite(original, args, kwargs)
            with record_function(f"aten::{_SDPA}"):
                return run_composite(_SDPA, original, args, kwargs)

        F.scaled_dot_product_attention = sdpa
        try:
            if clock is not None:
                with clock:
                    clock.last = time.perf_counter_ns()
                    yield self
            else:
                with record_function(BLOCK_RANGE):
                    yield self
        finally:
            F.scaled_dot_product_attention = original

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        yield


BLOCK_RANGE = "opgraph_host_block"
"""Profiler range around each recorded block of a profiled host-timing run."""


def clock_cost_ns(device: str = "meta", calls: int = 2000, profiled: bool = False) -> float:
    """What the clock (or, with ``profiled``, the CPU profiler) adds to one call: a view timed bare
    and under it (best of 5 loops each)."""
    x = torch.empty(64, 64, device=device)

    def loop() -> int:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            x.view(4096)
        return time.perf_counter_ns() - t0

    bare = min(loop() for _ in range(5))
    if profiled:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]):
            clocked = min(loop() for _ in range(5))
    else:
        with _Clock():
            clocked = min(loop() for _ in range(5))
    return max(0.0, (clocked - bare) / calls)


def _target_name(t: Any) -> str:
    return f"aten.{t}" if isinstance(t, str) else str(t)


def owned_calls(
    events: Sequence[Any], event_op: Sequence[int | None], event_targets: Sequence[str]
) -> list[tuple[Any, int | None, float]] | None:
    """The top-level calls of a profiled phase: (call, owning op, start of its block), or ``None``
    if the recording does not line up with the profile.

    ``events`` are the profiler's ``FunctionEvent``s; top-level calls are the children of the
    :data:`BLOCK_RANGE` ranges. Recorded events are found in them in order, by op name, depth
    first, not looking inside a matched call (the recorder does not see what runs inside a
    dispatched op either). A call's owner is the op of the first owned recorded event in it.
    """
    names = ["::".join(t.split(".")[:2]) for t in event_targets]  # aten.mm.default -> aten::mm
    k = 0
    out: list[tuple[Any, int | None, float]] = []

    def walk(e: Any) -> int | None:
        nonlocal k
        if k < len(names) and e.name == names[k]:
            owner = event_op[k]
            k += 1
            return owner
        owner = None
        for c in e.cpu_children:
            o = walk(c)
            owner = o if owner is None else owner
        return owner

    blocks = sorted((e for e in events if e.name == BLOCK_RANGE), key=lambda e: e.time_range.start)
    for block in blocks:
        for call in sorted(block.cpu_children, key=lambda e: e.time_range.start):
            out.append((call, walk(call), block.time_range.start))
    return out if k == len(names) else None


def align_profile(
    events: Sequence[Any], event_op: Sequence[int | None], event_targets: Sequence[str]
) -> list[tuple[float, float, int | None]] | None:
    """Per top-level call of a profiled phase: (gap before it, its own time, owning op), in us
    (see :func:`owned_calls`); ``None`` when the recording does not line up with the profile."""
    calls = owned_calls(events, event_op, event_targets)
    if calls is None:
        return None
    out: list[tuple[float, float, int | None]] = []
    prev_end = -math.inf
    for call, owner, block_start in calls:
        start, end = call.time_range.start, call.time_range.end
        out.append((start - max(prev_end, block_start), end - start, owner))
        prev_end = end
    return out


def measure_host_gaps(
    prepared: PreparedModel,
    opts: CaptureOptions,
    event_op: Sequence[int | None],
    event_targets: Sequence[str],
    *,
    runs: int = 3,
) -> HostTiming:
    """Run the phase ``runs`` times (after one warm-up); the framework time before each op.

    The runs go under the CPU profiler, whose per-call cost is small and mostly inside the call;
    where the phase cannot run as it is (a value a ``meta`` tensor does not have) or its profile
    does not line up, a Python clock that answers for those ops stamps every call instead.
    ``event_op`` and ``event_targets`` are the recording's op id and aten target per event; a
    clocked run that does not line up with them is dropped (:class:`CaptureError` when none does).
    """
    from opgraph.capture.sources import CaptureError

    def profiled(cache: Any, cost: float) -> dict[int, float]:
        from torch.profiler import ProfilerActivity, profile

        try:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run_phase(prepared, opts, _PhaseRun(), cache)
        except Exception as exc:  # a value a meta tensor does not have
            raise _NotAligned(str(exc)) from None
        calls = align_profile(prof.events(), event_op, event_targets)
        if calls is None:
            raise _NotAligned("the profiled calls do not line up with the recording")
        samples = [x for gap, own, _ in calls for x in (gap, own)]
        return attribute_gaps(samples, [o for _, _, o in calls], cost)

    def clocked(cache: Any, cost: float) -> dict[int, float] | None:
        run = _PhaseRun(_Clock())
        run_phase(prepared, opts, run, cache)
        assert run.clock is not None
        if [_target_name(t) for t in run.clock.targets] != list(event_targets):
            return None
        return attribute_gaps([ns / 1e3 for ns in run.clock.samples], event_op, cost)

    def repeat(one_run: Callable[[Any, float], dict[int, float] | None], cost: float) -> list[dict[int, float]]:
        with paused_gc():
            per_run = [one_run(setup_phase(prepared, opts), cost) for _ in range(runs + 1)][1:]
        return [r for r in per_run if r is not None]

    try:
        cost, source = clock_cost_ns(opts.device, profiled=True) / 1e3, "profiler"
        per_run = repeat(profiled, cost)
    except _NotAligned:
        cost, source = clock_cost_ns(opts.device) / 1e3, "python clock (microbenchmark cost)"
        per_run = repeat(clocked, cost)
    if not per_run:
        raise CaptureError(
            "the timed runs did not make the same aten calls as the recording",
            where="--host-timing",
            hint="the model's control flow changes between runs; capture without --host-timing",
        )
    return HostTiming(
        gaps_us={op: statistics.median(r.get(op, 0.0) for r in per_run) for op in per_run[0]},
        calls=len(event_targets),
        runs=len(per_run),
        clock_overhead_us=cost,
        overhead_source=source,
        host=_cpu_name(),
    )


def median_timing(timings: Sequence[HostTiming]) -> HostTiming:
    """One timing from several taken at different moments: per op, the median of their gaps."""
    if not timings:
        raise ValueError("no host timings to combine")
    first = timings[0]
    ops = sorted(set().union(*(t.gaps_us for t in timings)))
    gaps = {op: statistics.median(t.gaps_us.get(op, 0.0) for t in timings) for op in ops}
    return replace(first, gaps_us=gaps, runs=sum(t.runs for t in timings))


class _NotAligned(Exception):
    """The profiled runs could not be used."""


def attribute_gaps(samples: Sequence[float], event_op: Sequence[int | None], clock: float) -> dict[int, float]:
    """Framework host time per op from per-call ``(gap, own time)`` pairs, flattened.

    An op's share is the time since the previous op's last call: the gaps and own times of the calls
    folded into no op (``None``: views, constants) in between, and the gap before its own first call,
    less the ``clock``'s cost for each of those calls (never below zero). The op's own calls and the
    Python between them are left out: replay runs and times them on the device. Folded calls after
    the last op are left out too (no op follows them).
    """
    out: dict[int, float] = {}
    pending, pending_calls = 0.0, 0
    previous: int | None = None
    for k, op in enumerate(event_op):
        pending += samples[2 * k]
        pending_calls += 1
        if op is None:
            pending += samples[2 * k + 1]
            continue
        if op != previous:
            out[op] = out.get(op, 0.0) + pending - pending_calls * clock
        pending, pending_calls, previous = 0.0, 0, op
    return {op: max(0.0, v) for op, v in out.items()}


def with_host_gaps(graph: OpGraph, timing: HostTiming) -> OpGraph:
    """The graph with ``host_gap_us`` set on every op and the measurement named in its settings."""
    summary = HostTimingSummary(
        total_us=round(timing.total_us, 1),
        cpu=timing.host,
        clock_overhead_us=round(timing.clock_overhead_us, 3),
        overhead_source=timing.overhead_source,
    )
    gaps = {op.id: round(timing.gaps_us.get(op.id, 0.0), 3) for op in graph.ops}
    return _set_gaps(graph, gaps, summary)


def carry_host_gaps(source: OpGraph, target: OpGraph) -> OpGraph:
    """``target`` with the host gaps (and their settings) of ``source``, a capture of the same phase
    (a meta capture timed with ``host_timing`` for a profiled run on the device, say).

    Raises :class:`ValueError` when the two graphs do not have the same ops.
    """
    src = {op.id: op for op in source.ops}
    if len(src) != len(target.ops) or any(
        op.id not in src or src[op.id].definition != op.definition for op in target.ops
    ):
        raise ValueError("the graphs differ op for op: host gaps cannot be carried over")
    return _set_gaps(target, {i: op.host_gap_us for i, op in src.items()}, source.metadata.host_timing)


def without_host_gaps(graph: OpGraph) -> OpGraph:
    """``graph`` as captured without ``--host-timing``: no op has a host gap, the settings name none."""
    return _set_gaps(graph, {}, None)


def _set_gaps(graph: OpGraph, gaps: Mapping[int, float | None], summary: HostTimingSummary | None) -> OpGraph:
    ops = tuple(op.model_copy(update={"host_gap_us": gaps.get(op.id)}) for op in graph.ops)
    settings = capture_settings(graph.metadata.capture).model_copy(update={"host_timing": summary})
    md = graph.metadata.model_copy(update={"capture": settings})
    return type(graph).model_construct(metadata=md, ops=ops, edges=graph.edges)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
