"""Timing one op on a device: warm-up, device-event samples until the median is tight, robust stats.

On CUDA each sample is bracketed by CUDA events. A spin kernel (``torch.cuda._sleep``, when this
torch has it) is queued before each sample for longer than the host needs to issue the op, so the
op's kernels are already queued when the GPU reaches them and the events measure device time, not
launch latency. Very short ops are issued several times per sample (warm L2 only) so the event
resolution does not dominate. On the CPU a monotonic clock (``perf_counter_ns``) times each sample.

The default CUDA timer (``kernels``) sums the durations of the kernels the op launches, as the
profiler records them, over profiler sessions of about ``kernel_session_ms`` of device work each
(one sample a session). Each call of the op runs inside a ``record_function`` range
(:data:`OP_RANGE`) and only kernels launched inside it count, so the L2 flush and the warm-up
reads around it are separated exactly.

With ``cold_l2`` a buffer twice the L2 size is read before each call, then (``warm_activations``)
the op's activation inputs are read back: in the model those were just written by the op before
and sit in L2, while its weights come from DRAM.

Sampling stops (:func:`stop_sampling`) when the 95% confidence half-width of the median (about
``1.57 * IQR / sqrt(n)``) is below ``target_ci`` of the median, or at the sample or time cap; never
before the minimum.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from opgraph.ir import OpgraphError
from validators.results import TimingStats

if TYPE_CHECKING:
    import torch

OP_RANGE = "opgraph_replay_op"
"""Name of the profiler range around each timed call of the op (kernels timer)."""


class BusyWindows(Protocol):
    """Something told when the device is busy with timed work (a clock sampler)."""

    def window(self) -> AbstractContextManager[Any]:
        """A block during which the device runs the timed work."""
        ...


def _busy(clock: BusyWindows | None) -> AbstractContextManager[Any]:
    return clock.window() if clock is not None else contextlib.nullcontext()


CudaTimerKind = Literal["kernels", "events"]
"""How replay times an op on CUDA (:attr:`TimingConfig.timer`)."""


@dataclass(frozen=True)
class TimingConfig:
    """How hard to try for a stable median."""

    warmup_ms: float = 25.0
    """Untimed calls for at least this long (and at least ``min_warmup`` calls)."""
    min_warmup: int = 3
    """Fewest warm-up calls."""
    min_samples: int = 10
    """Fewest timed samples."""
    max_samples: int = 300
    """Most timed samples."""
    max_time_s: float = 1.0
    """Stop sampling after this long (wall time spent sampling one config)."""
    target_ci: float = 0.005
    """Stop once the median's 95% confidence half-width is below this fraction of it."""
    cold_l2: bool = False
    """Flush the L2 cache before each sample (one call per sample)."""
    warm_activations: bool = True
    """With ``cold_l2``: after the flush, read the op's activation inputs back into L2 (the model
    just wrote them), so only weights and inputs from an earlier forward are cold."""
    min_sample_us: float = 40.0
    """Very short ops are issued several times per sample to fill at least this long (warm L2 only)."""
    batch: int = 10
    """Samples queued between synchronisations on CUDA."""
    timer: CudaTimerKind = "kernels"
    """CUDA timer: ``kernels`` sums the op's kernel durations as the profiler records them (the GPU
    time a measured trace counts; no launch gaps, no idle clocks), ``events`` brackets each sample
    with CUDA events (elapsed device time, gaps between the op's kernels included)."""
    kernel_sessions: int = 9
    """Fewest profiler sessions (samples) for the ``kernels`` timer."""
    max_kernel_sessions: int = 25
    """Most profiler sessions: sessions are added until the median is within ``target_ci``."""
    kernel_max_time_s: float = 5.0
    """Stop adding profiler sessions after this long (the fewest always run)."""
    kernel_session_ms: float = 20.0
    """Device work per profiler session: long enough to average out clock and power transients."""
    device_warmup_s: float = 1.0
    """Before the first op, keep the GPU busy this long so every run starts from a steady power state."""

    def __post_init__(self) -> None:
        if self.timer not in get_args(CudaTimerKind):
            raise OpgraphError(
                f"unknown timer {self.timer!r}",
                where="TimingConfig.timer",
                hint=f"use {' or '.join(get_args(CudaTimerKind))}",
            )


def summarize(samples_us: list[float], **extra: Any) -> TimingStats:
    """Median, IQR, MAD and relative spread of per-call samples (microseconds)."""
    xs = sorted(samples_us)
    n = len(xs)
    med = statistics.median(xs)
    if n >= 4:
        q = statistics.quantiles(xs, n=4, method="inclusive")
        iqr = q[2] - q[0]
    else:
        iqr = xs[-1] - xs[0]
    mad = statistics.median(abs(x - med) for x in xs)
    return TimingStats(
        median_us=max(med, 0.0),
        iqr_us=max(iqr, 0.0),
        mad_us=max(mad, 0.0),
        spread=iqr / med if med > 0 else 0.0,
        min_us=max(xs[0], 0.0),
        mean_us=max(statistics.fmean(xs), 0.0),
        samples=n,
        **extra,
    )


def ci_rel(xs: Sequence[float]) -> float:
    """Approximate relative 95% confidence half-width of the median: ``1.57 * IQR / sqrt(n) / median``.

    0 for a non-positive median (nothing to resolve), infinite for fewer than two samples.
    """
    n = len(xs)
    if n < 2:
        return math.inf
    s = sorted(xs)
    med = statistics.median(s)
    if med <= 0:
        return 0.0
    q = statistics.quantiles(s, n=4, method="inclusive")
    return 1.57 * (q[2] - q[0]) / math.sqrt(n) / med


def stop_sampling(
    xs: Sequence[float],
    *,
    min_n: int,
    max_n: int,
    target_ci: float,
    elapsed_s: float = 0.0,
    max_time_s: float = math.inf,
) -> bool:
    """Whether to stop taking samples after ``xs``: never before ``min_n``, always at ``max_n``.

    In between, stop once the median's relative 95% confidence half-width (:func:`ci_rel`) is at
    most ``target_ci``, or once ``elapsed_s`` has reached ``max_time_s``.
    """
    n = len(xs)
    if n < max(min_n, 1):
        return False
    if n >= max_n:
        return True
    return ci_rel(xs) <= target_ci or elapsed_s >= max_time_s


def _converged(xs: list[float], cfg: TimingConfig) -> bool:
    return len(xs) >= cfg.min_samples and ci_rel(xs) <= cfg.target_ci


_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def read_view(t: Any) -> Any:
    """A same-shape integer view of tensor ``t`` that any reduction can read (bool, fp8, floats).

    ``None`` for what cannot or need not be read: non-tensors, empty and complex tensors.
    """
    import torch

    if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.dtype.is_complex:
        return None
    name = _INT_OF_SIZE.get(t.element_size())
    if name is None:
        return None
    target = getattr(torch, name)
    # Same element size: the view keeps the tensor's shape and strides, so exactly its bytes are read.
    return t if t.dtype == target else t.view(target)


def touch(views: Iterable[Any]) -> None:
    """Read every element of each view (one reduction kernel per tensor) to bring it into the cache."""
    for v in views:
        v.max()


CUPTI_OVERHEAD = frozenset(
    {
        "Driver Compiler",
        "Buffer Flush",
        "Instrumentation",
        "Resource",
        "Runtime Triggered Module Loading",
        "Lazy Function Loading",
        "Command Buffer Full",
        "Activity Buffer Request",
        "UVM Activity Init",
    }
)
"""CUPTI's overhead activities, which the profiler shows as CPU events. torch (2.11 at least) can append
an op's kernels to such an event as well when their ids collide (pytorch/pytorch#196282), so a walk that
counted them would count those kernels twice: they are never an op's."""


def _on_cpu(e: Any) -> bool:
    dt = getattr(e, "device_type", None)
    return dt is not None and str(getattr(dt, "name", dt)).upper().endswith("CPU")


def range_kernel_us(events: Iterable[Any], name: str = OP_RANGE) -> tuple[float, float, int]:
    """Device time of kernels launched inside the ``name`` ranges, all device time, and the ranges.

    ``events`` are the profiler's ``FunctionEvent`` objects (``prof.events()``). The kernels of a
    CPU-side event are those the profiler correlated with it (``FunctionEvent.kernels``); a range's
    kernels are those of its CPU subtree (what ``device_time_total`` sums), walked here so that a
    device-side annotation of the range (``gpu_user_annotation``) is never counted as a kernel, nor a
    kernel twice through a CUPTI overhead event that lists it too (:data:`CUPTI_OVERHEAD`).
    Returns microseconds: (inside the ranges, every device event, number of ranges).
    """
    evs = list(events)
    total = 0.0
    for e in evs:
        if _on_cpu(e) or e.name == name or getattr(e, "is_user_annotation", False):
            continue
        total += float(e.time_range.elapsed_us())
    inside = 0.0
    ranges = 0
    for e in evs:
        if e.name != name or not _on_cpu(e) or getattr(e, "is_async", False):
            continue
        ranges += 1
        stack = [e]
        while stack:
            ev = stack.pop()
            inside += sum(float(k.duration) for k in getattr(ev, "kernels", ()) if k.name != name)
            stack.extend(c for c in getattr(ev, "cpu_children", ()) if c.name != name and c.name not in CUPTI_OVERHEAD)
    return inside, total, ranges


def time_cpu(fn: Callable[[], Any], cfg: TimingConfig) -> TimingStats:
    """Time ``fn`` on the host with ``perf_counter_ns``."""
    clock = time.perf_counter_ns
    t_end = clock() + int(cfg.warmup_ms * 1e6)
    warm = 0
    first = clock()
    while warm < cfg.min_warmup or clock() < t_end:
        fn()
        warm += 1
        if warm >= 10_000:
            break
    per_call_us = (clock() - first) / 1e3 / warm
    reps = 1 if per_call_us >= cfg.min_sample_us else min(100, math.ceil(cfg.min_sample_us / max(per_call_us, 0.01)))
    xs: list[float] = []
    deadline = clock() + int(cfg.max_time_s * 1e9)
    while len(xs) < cfg.max_samples:
        t0 = clock()
        for _ in range(reps):
            fn()
        xs.append((clock() - t0) / 1e3 / reps)
        if _converged(xs, cfg) or (clock() > deadline and len(xs) >= min(cfg.min_samples, 3)):
            break
    return summarize(
        xs, calls_per_sample=reps, warmup_calls=warm, timer="perf_counter", host_us=None,
        converged=_converged(xs, cfg),
    )  # fmt: skip


class CudaTimer:
    """Times callables on one CUDA device with events; keeps its flush buffer and sleep calibration."""

    def __init__(self, device: torch.device) -> None:
        import torch

        self.device = device
        self._flush: torch.Tensor | None = None
        self._sleep: Callable[[int], None] | None = getattr(torch.cuda, "_sleep", None)
        self._cycles_per_us: float | None = None
        self._warmed = False
        self._l2: int | None = None

    def _calibrate_sleep(self) -> float:
        import torch as _torch

        torch: Any = _torch
        if self._cycles_per_us is None:
            assert self._sleep is not None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            cycles = 2_000_000
            self._sleep(cycles)  # first call loads the kernel
            torch.cuda.synchronize(self.device)
            start.record()
            self._sleep(cycles)
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1e3
            self._cycles_per_us = cycles / us if us > 0 else 1500.0
        return self._cycles_per_us

    @property
    def l2_bytes(self) -> int:
        """The device's L2 cache size in bytes (64 MiB when the driver does not say)."""
        import torch

        if self._l2 is None:
            props = torch.cuda.get_device_properties(self.device)
            self._l2 = int(getattr(props, "L2_cache_size", 0) or 0) or 64 * 2**20
        return self._l2

    def _flush_l2(self) -> None:
        import torch

        if self._flush is None:
            self._flush = torch.zeros(2 * self.l2_bytes // 4, dtype=torch.int32, device=self.device)
        # Read (not write) a buffer twice the L2 size: the L2 ends up holding clean lines, so the op
        # does not pay for writing the flush back, as it would after a memset.
        self._flush.max()

    def _prepare(self, cfg: TimingConfig, warm: Sequence[Any], dirty_bytes: int = 0) -> Callable[[], None] | None:
        """What runs before each timed call: the L2 flush, a write of ``dirty_bytes`` (the start of
        the flush buffer, zeroed again: dirty lines, as the op before leaves its output), then reads
        of the warm inputs; or nothing."""
        if not cfg.cold_l2:
            return None
        views = [v for v in (read_view(t) for t in warm) if v is not None] if cfg.warm_activations else []
        self._flush_l2()
        assert self._flush is not None
        dirty = self._flush[: min(dirty_bytes, self.l2_bytes) // 4] if cfg.warm_activations and dirty_bytes else None

        def prepare() -> None:
            self._flush_l2()
            if dirty is not None:
                dirty.zero_()
            touch(views)

        return prepare

    def time(
        self,
        fn: Callable[[], Any],
        cfg: TimingConfig,
        *,
        warm: Sequence[Any] = (),
        dirty_bytes: int = 0,
        busy: BusyWindows | None = None,
    ) -> TimingStats:
        """Time ``fn`` (one call of the op) on the GPU (kernel sum or events, see :class:`TimingConfig`).

        ``warm``: tensors read into L2 after each flush (with ``cold_l2`` and ``warm_activations``);
        ``dirty_bytes``: bytes written after the flush, left dirty in L2 for the op to write back.
        ``busy``: told (``window()``) while the timed work runs, to sample the SM clock then only.
        """
        import torch

        with torch.cuda.device(self.device):
            if not self._warmed and cfg.device_warmup_s > 0:
                self._warm_device(cfg.device_warmup_s, torch)
            return self._time(fn, cfg, torch, self._prepare(cfg, warm, dirty_bytes), busy)

    def _warm_device(self, seconds: float, torch: Any) -> None:
        # Clocks and power settle within about a second of sustained work; measure from there.
        a = torch.randn(4096, 4096, device=self.device, dtype=torch.bfloat16)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize(self.device)
        self._warmed = True

    def _issue_us(self, fn: Callable[[], Any], torch: Any, bursts: int = 7, calls: int = 4) -> tuple[float, float]:
        """Host time to issue one call, as in a model run: a few calls after the device has caught
        up, so no launch waits for room in the queue (median over bursts); and, in the same bursts, the
        issue time of a reference call, a one-element in-place add: the host's speed at that moment (a
        shared host's drifts within seconds; ``ProfilePoint.host_ref_s``)."""
        clock = time.perf_counter_ns
        x = torch.zeros(1, device=self.device)
        xs: list[float] = []
        refs: list[float] = []
        for _ in range(bursts):
            for call, out in ((fn, xs), (lambda: x.add_(1), refs)):
                torch.cuda.synchronize(self.device)
                for _ in range(calls):
                    t0 = clock()
                    call()
                    out.append((clock() - t0) / 1e3)
        torch.cuda.synchronize(self.device)
        return statistics.median(xs), statistics.median(refs)

    def _time(
        self,
        fn: Callable[[], Any],
        cfg: TimingConfig,
        torch: Any,
        prepare: Callable[[], None] | None,
        busy: BusyWindows | None = None,
    ) -> TimingStats:
        clock = time.perf_counter_ns
        # Warm-up: also measures a rough device time.
        warm = 0
        t_end = clock() + int(cfg.warmup_ms * 1e6)
        w0, w1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        w0.record()
        while warm < cfg.min_warmup or clock() < t_end:
            fn()
            warm += 1
            if warm >= 2000:
                break
            if warm == cfg.min_warmup:
                torch.cuda.synchronize()  # keep the queue short while the deadline is checked
        w1.record()
        torch.cuda.synchronize()
        rough_us = w0.elapsed_time(w1) * 1e3 / warm
        host_us, host_ref_us = self._issue_us(fn, torch)
        reps = 1
        if not cfg.cold_l2 and rough_us < cfg.min_sample_us:
            reps = min(64, max(1, math.ceil(cfg.min_sample_us / max(rough_us, 0.5))))
        if cfg.timer == "kernels":
            return self._time_kernels(
                fn, cfg, torch, prepare, warm=warm, host_us=host_us, host_ref_us=host_ref_us, rough_us=rough_us,
                busy=busy,
            )  # fmt: skip
        lead_cycles = 0
        if self._sleep is not None:
            lead_us = min(20_000.0, 1.5 * host_us * reps + 20.0)
            lead_cycles = int(lead_us * self._calibrate_sleep())
        xs: list[float] = []
        deadline = clock() + int(cfg.max_time_s * 1e9)
        while len(xs) < cfg.max_samples:
            pairs = []
            with _busy(busy):
                for _ in range(cfg.batch):
                    if prepare is not None:
                        prepare()
                    if lead_cycles:
                        self._sleep(lead_cycles)  # type: ignore[misc]
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    for _ in range(reps):
                        fn()
                    e.record()
                    pairs.append((s, e))
                pairs[-1][1].synchronize()
            xs.extend(s.elapsed_time(e) * 1e3 / reps for s, e in pairs)
            if _converged(xs, cfg) or clock() > deadline:
                break
        timer = "cuda_events" + ("" if lead_cycles else "_no_lead")
        return summarize(
            xs, calls_per_sample=reps, warmup_calls=warm, timer=timer, cold_l2=cfg.cold_l2,
            host_us=host_us, host_ref_us=host_ref_us, converged=_converged(xs, cfg),
        )  # fmt: skip

    def _time_kernels(
        self,
        fn: Callable[[], Any],
        cfg: TimingConfig,
        torch: Any,
        prepare: Callable[[], None] | None,
        *,
        warm: int,
        host_us: float,
        rough_us: float,
        host_ref_us: float | None = None,
        busy: BusyWindows | None = None,
    ) -> TimingStats:
        """Sum of the op's kernel durations per call, from CUPTI via torch.profiler (one sample a session).

        Each call runs inside an :data:`OP_RANGE` range and only the kernels launched inside it
        count. Should the profiler attribute no kernel to the ranges while it recorded some, the
        kernels of ``prepare`` (flush and warm reads), profiled alone once, are taken off the total.
        """
        from torch.profiler import ProfilerActivity, profile, record_function

        work_us = cfg.kernel_session_ms * 1e3
        calls = max(3, min(500, math.ceil(work_us / max(rough_us, 1.0))))
        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        xs: list[float] = []
        ways: set[str] = set()
        prep_us: float | None = None
        lo = max(3, cfg.kernel_sessions)
        hi = max(lo, cfg.max_kernel_sessions)
        start = time.perf_counter()
        while True:
            with profile(activities=activities) as prof, _busy(busy):
                for _ in range(calls):
                    if prepare is not None:
                        prepare()
                    with record_function(OP_RANGE):
                        fn()
                torch.cuda.synchronize()
            inside, total, _ranges = range_kernel_us(prof.events())
            if inside > 0 or total <= 0:
                xs.append(inside / calls)
                ways.add("range")
            else:
                if prep_us is None:
                    prep_us = self._prepare_us(prepare, calls, torch) if prepare is not None else 0.0
                xs.append(max(total / calls - prep_us, 0.0))
                ways.add("subtracted")
            if stop_sampling(
                xs, min_n=lo, max_n=hi, target_ci=cfg.target_ci, elapsed_s=time.perf_counter() - start,
                max_time_s=cfg.kernel_max_time_s,
            ):  # fmt: skip
                break
        return summarize(
            xs, calls_per_sample=calls, warmup_calls=warm, timer="cuda_kernels", cold_l2=cfg.cold_l2, host_us=host_us,
            host_ref_us=host_ref_us, converged=ci_rel(xs) <= cfg.target_ci, attribution="+".join(sorted(ways)),
        )  # fmt: skip

    def _prepare_us(self, prepare: Callable[[], None], calls: int, torch: Any) -> float:
        """Device time of ``prepare`` (flush and warm reads) per call, profiled alone (the fallback)."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                prepare()
            torch.cuda.synchronize()
        return range_kernel_us(prof.events())[1] / calls


def synchronize(device: torch.device) -> None:
    """Wait for the device (a no-op on the CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
