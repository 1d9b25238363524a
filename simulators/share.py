"""Fluid sharing of one device by the ops running at once on its engines.

An engine runs one op at a time; it is not a share of the hardware. Op ``i`` alone, for its
duration ``d_i``, uses ``c_i = compute_us_i / d_i`` of the device's peak FLOP/s and
``m_i = memory_us_i / d_i`` of its memory bandwidth (its FLOPs at the peak and bytes at full
bandwidth, :func:`hardware.base.peak_times`). While a set of ops runs together, each progresses at
``s = min(1, 1 / sum(c), 1 / sum(m))`` of its own speed (processor sharing), so no schedule beats
the device's roofline, and an op alone runs for its own duration.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import numpy as np
from simpy import Environment
from simpy.events import Event, Process, Timeout
from simpy.exceptions import Interrupt

FULL = 1.0 + 1e-9
"""Demands summing to at most this fit the device (rounding of the running sums aside)."""


def device_share(
    compute_us: Sequence[float], memory_us: Sequence[float], dur_us: list[float], engines: int
) -> DeviceShare | None:
    """The sharing state of one rank's device for ops of durations ``dur_us`` on ``engines`` engines,
    or ``None`` when even the ``engines`` most demanding ops fit the device together (none is ever
    slowed, and the engines can hold each op for its own duration)."""
    cfrac = _fractions(np.asarray(compute_us, dtype=float), dur_us)
    mfrac = _fractions(np.asarray(memory_us, dtype=float), dur_us)
    if _top_sum(cfrac, engines) <= FULL and _top_sum(mfrac, engines) <= FULL:
        return None
    return DeviceShare(cfrac.tolist(), mfrac.tolist())


def _rate(sum_c: float, sum_m: float) -> float:
    """Progress rate of ops that together use ``sum_c`` of the device's compute and ``sum_m`` of its
    memory bandwidth when each runs at its own speed (1: no contention)."""
    if sum_c <= FULL and sum_m <= FULL:
        return 1.0
    return 1.0 / max(sum_c, sum_m)


def _fractions(work_us: np.ndarray, dur_us: list[float]) -> np.ndarray:
    """Fraction of a device resource each op uses alone: its work at the peak over its duration (at most 1)."""
    dur = np.asarray(dur_us, dtype=float)
    out = np.zeros_like(dur)
    busy = dur > 0
    out[busy] = np.minimum(1.0, work_us[busy] / dur[busy])
    return out


def _top_sum(values: np.ndarray, k: int) -> float:
    """Sum of the ``k`` largest values."""
    if k >= values.size:
        return float(values.sum())
    return float(np.partition(values, values.size - k)[values.size - k :].sum())


class DeviceShare:
    """The ops running at once on one rank's engines, sharing the device's peaks (fluid sharing).

    Op ``i`` alone uses ``cfrac[i]`` of the device's peak FLOP/s and ``mfrac[i]`` of its memory
    bandwidth. All running ops progress at one rate ``s = min(1, 1/sum(c), 1/sum(m))`` of their own
    speed; ``end[i]`` is op ``i``'s planned end at the current rate. A change of rate re-plans every
    running op and bumps its ``ver``, so its engine knows its timer is stale: a rate that falls
    (an op started) moves ends later, and the engines re-arm when their timers fire; a rate that
    rises (an op ended) moves them earlier, so the engines are interrupted to re-arm.
    """

    __slots__ = ("cfrac", "end", "mfrac", "poked", "proc", "rate", "running", "slowed", "sum_c", "sum_m", "ver")

    def __init__(self, cfrac: list[float], mfrac: list[float]) -> None:
        self.cfrac = cfrac
        self.mfrac = mfrac
        n = len(cfrac)
        self.end = [0.0] * n
        self.ver = [0] * n
        self.proc: list[Process | None] = [None] * n
        self.slowed = bytearray(n)
        self.poked = bytearray(n)
        """Ops whose engine has an interrupt it has not handled yet (a second one could reach it idle)."""
        self.running: list[int] = []
        self.sum_c = 0.0
        self.sum_m = 0.0
        self.rate = 1.0

    def hold(self, env: Environment, i: int, dur: float) -> Generator[Event, object, float | None]:
        """Run op ``i`` (``dur`` alone) on the calling engine from now until it is done, at the
        device's rate; the time it took, or ``None`` when it ran at full speed throughout (then it
        took exactly ``dur``, as an engine that holds it for ``dur`` would say)."""
        start = env.now
        proc = env.active_process
        assert proc is not None
        delay = self.begin(i, start, dur, proc)
        exact = delay == dur
        ver = self.ver[i]
        while True:
            try:
                yield Timeout(env, delay)
                if self.ver[i] == ver:  # not re-planned since the timer was armed: done
                    break
            except Interrupt:  # the rate rose: the op ends earlier than the timer
                self.poked[i] = 0
            exact = False
            ver = self.ver[i]
            delay = self.end[i] - env.now
            if delay <= 0.0:
                break
        self.finish(i, env.now)
        return None if exact else env.now - start

    def begin(self, i: int, now: float, dur: float, proc: Process) -> float:
        """Op ``i`` starts now on ``proc``'s engine; the delay to its planned end."""
        self.running.append(i)
        self.proc[i] = proc
        self.sum_c += self.cfrac[i]
        self.sum_m += self.mfrac[i]
        rate = _rate(self.sum_c, self.sum_m)
        if rate != self.rate:
            self._replan(now, rate)
        if rate == 1.0:
            delay = dur
        else:
            delay = dur / rate
            self.slowed[i] = 1
        self.end[i] = now + delay
        return delay

    def finish(self, i: int, now: float) -> None:
        """Op ``i`` ended now: the others speed up if it held them back."""
        running = self.running
        running.remove(i)
        self.proc[i] = None
        if running:
            self.sum_c -= self.cfrac[i]
            self.sum_m -= self.mfrac[i]
        else:  # drop the rounding the running sums gathered
            self.sum_c = self.sum_m = 0.0
        rate = _rate(self.sum_c, self.sum_m)
        if rate != self.rate:
            rising = rate > self.rate
            self._replan(now, rate)
            if rising:
                poked = self.poked
                for j in running:
                    if not poked[j]:
                        proc = self.proc[j]
                        assert proc is not None
                        poked[j] = 1
                        proc.interrupt()

    def _replan(self, now: float, rate: float) -> None:
        scale = self.rate / rate
        end, ver, slowed = self.end, self.ver, self.slowed
        for j in self.running:
            end[j] = now + (end[j] - now) * scale
            ver[j] += 1
            if rate < 1.0:
                slowed[j] = 1
        self.rate = rate
