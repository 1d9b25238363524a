"""Timing one op on a device: warm-up, device-event samples until the median is tight, robust stats.

On CUDA each sample is bracketed by CUDA events. A spin kernel (``torch.cuda._sleep``, when this
torch has it) is queued before each sample for longer than the host needs to issue the op, so the
op's kernels are already queued when the GPU reaches them and the events measure device time, not
launch latency. Very short ops are issued several times per sample (warm L2 only) so the event
resolution does not dominate. With ``cold_l2`` a buffer twice the L2 size is read before each
sample. On the CPU a monotonic clock (``perf_counter_ns``) times each sample.

Sampling stops when the 95% confidence half-width of the median (about ``1.57 * IQR / sqrt(n)``)
is below ``target_ci`` of the median, or at the sample or time cap.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from validators.results import TimingStats

if TYPE_CHECKING:
    import torch


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
    min_sample_us: float = 40.0
    """Very short ops are issued several times per sample to fill at least this long (warm L2 only)."""
    batch: int = 10
    """Samples queued between synchronisations on CUDA."""
    timer: str = "kernels"
    """CUDA timer: ``kernels`` sums the op's kernel durations as the profiler records them (the GPU
    time a measured trace counts; no launch gaps, no idle clocks), ``events`` brackets each sample
    with CUDA events (elapsed device time, gaps between the op's kernels included)."""
    kernel_sessions: int = 9
    """Profiler sessions (samples) for the ``kernels`` timer."""
    kernel_session_ms: float = 20.0
    """Device work per profiler session: long enough to average out clock and power transients."""
    device_warmup_s: float = 1.0
    """Before the first op, keep the GPU busy this long so every run starts from a steady power state."""


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


def _converged(xs: list[float], cfg: TimingConfig) -> bool:
    if len(xs) < cfg.min_samples:
        return False
    s = sorted(xs)
    med = statistics.median(s)
    if med <= 0:
        return True
    q = statistics.quantiles(s, n=4, method="inclusive")
    return 1.57 * (q[2] - q[0]) / math.sqrt(len(s)) / med <= cfg.target_ci


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

    def _flush_l2(self) -> None:
        import torch

        if self._flush is None:
            props = torch.cuda.get_device_properties(self.device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0) or 64 * 2**20
            self._flush = torch.zeros(2 * l2 // 4, dtype=torch.int32, device=self.device)
        # Read (not write) a buffer twice the L2 size: the L2 ends up holding clean lines, so the op
        # does not pay for writing the flush back, as it would after a memset.
        self._flush.max()

    def time(self, fn: Callable[[], Any], cfg: TimingConfig) -> TimingStats:
        """Time ``fn`` (one call of the op) on the GPU (kernel sum or events, see :class:`TimingConfig`)."""
        import torch

        with torch.cuda.device(self.device):
            if not self._warmed and cfg.device_warmup_s > 0:
                self._warm_device(cfg.device_warmup_s, torch)
            return self._time(fn, cfg, torch)

    def _warm_device(self, seconds: float, torch: Any) -> None:
        # Clocks and power settle within about a second of sustained work; measure from there.
        a = torch.randn(4096, 4096, device=self.device, dtype=torch.bfloat16)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize(self.device)
        self._warmed = True

    def _time(self, fn: Callable[[], Any], cfg: TimingConfig, torch: Any) -> TimingStats:
        clock = time.perf_counter_ns
        # Warm-up: also measures the host time to issue one call, and a rough device time.
        host: list[float] = []
        warm = 0
        t_end = clock() + int(cfg.warmup_ms * 1e6)
        w0, w1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        w0.record()
        while warm < cfg.min_warmup or clock() < t_end:
            t0 = clock()
            fn()
            host.append((clock() - t0) / 1e3)
            warm += 1
            if warm >= 2000:
                break
            if warm == cfg.min_warmup:
                torch.cuda.synchronize()  # keep the queue short while the deadline is checked
        w1.record()
        torch.cuda.synchronize()
        rough_us = w0.elapsed_time(w1) * 1e3 / warm
        host_us = statistics.median(host)
        reps = 1
        if not cfg.cold_l2 and rough_us < cfg.min_sample_us:
            reps = min(64, max(1, math.ceil(cfg.min_sample_us / max(rough_us, 0.5))))
        if cfg.timer == "kernels":
            return self._time_kernels(fn, cfg, torch, warm=warm, host_us=host_us, rough_us=rough_us)
        lead_cycles = 0
        if self._sleep is not None:
            lead_us = min(20_000.0, 1.5 * host_us * reps + 20.0)
            lead_cycles = int(lead_us * self._calibrate_sleep())
        xs: list[float] = []
        deadline = clock() + int(cfg.max_time_s * 1e9)
        while len(xs) < cfg.max_samples:
            pairs = []
            for _ in range(cfg.batch):
                if cfg.cold_l2:
                    self._flush_l2()
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
            host_us=host_us, converged=_converged(xs, cfg),
        )  # fmt: skip

    def _time_kernels(
        self, fn: Callable[[], Any], cfg: TimingConfig, torch: Any, *, warm: int, host_us: float, rough_us: float
    ) -> TimingStats:
        """Sum of the op's kernel durations per call, from CUPTI via torch.profiler (one sample a session)."""
        from torch.profiler import ProfilerActivity, profile

        work_us = cfg.kernel_session_ms * 1e3
        calls = max(3, min(500, math.ceil(work_us / max(rough_us, 1.0))))
        xs: list[float] = []
        deadline = time.perf_counter() + cfg.max_time_s
        flush_us = 0.0
        if cfg.cold_l2:
            # The flush kernels are profiled with the op; their own time, profiled alone, is taken off.
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    self._flush_l2()
                torch.cuda.synchronize()
            flush_us = sum(float(getattr(e, "device_time_total", 0.0) or 0.0) for e in prof.key_averages()) / calls
        for _ in range(max(3, cfg.kernel_sessions)):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    if cfg.cold_l2:
                        self._flush_l2()
                    fn()
                torch.cuda.synchronize()
            total_us = sum(float(getattr(e, "device_time_total", 0.0) or 0.0) for e in prof.key_averages())
            xs.append(max(total_us / calls - flush_us, 0.0))
            if time.perf_counter() > deadline and len(xs) >= 3:
                break
        return summarize(
            xs, calls_per_sample=calls, warmup_calls=warm, timer="cuda_kernels", cold_l2=cfg.cold_l2, host_us=host_us,
            converged=_converged(xs, cfg),
        )  # fmt: skip


def synchronize(device: torch.device) -> None:
    """Wait for the device (a no-op on the CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
