"""Board energy per call from NVML (``pynvml`` / ``nvidia-ml-py``), where it is installed.

The op runs back to back for a window (at least ``window_s``); the energy is the change of NVML's
total-energy counter (millijoules, Volta and newer) over the window divided by the calls. Where the
counter is missing, a thread samples board power every few milliseconds and the samples are
integrated. The idle board power, measured once before the first config, gives the energy above
idle as well. Everything degrades to ``None`` with a reason when NVML is absent.

The same NVML handle reads the SM clock: :class:`ClockSampler` samples it on a thread while a
config is timed, so a median that moved between runs can be put down to clocks (or not).
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from validators.results import EnergyStats

if TYPE_CHECKING:
    import torch


class EnergyMeter:
    """NVML access for one CUDA device; ``available`` is False (with ``why``) when NVML cannot be used."""

    def __init__(self, device: torch.device) -> None:
        self.available = False
        self.why = ""
        self.idle_w: float | None = None
        self._nvml: Any = None
        self._handle: Any = None
        self._counter = False
        self.clock_available = False
        if device.type != "cuda":
            self.why = "energy needs a CUDA device"
            return
        try:
            import pynvml
        except ImportError:
            self.why = "pynvml is not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = self._device_handle(device)
            pynvml.nvmlDeviceGetPowerUsage(self._handle)
        except Exception as exc:  # NVML raises its own error types; any failure means no energy
            self.why = f"NVML unavailable: {exc}"
            return
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            self._counter = True
        except Exception:
            self._counter = False
        try:
            self.sm_clock_mhz()
            self.clock_available = True
        except Exception:  # an NVML without clock queries (or a fake one): no clocks
            self.clock_available = False
        self.available = True

    def _device_handle(self, device: torch.device) -> Any:
        import torch

        nvml = self._nvml
        idx = device.index if device.index is not None else torch.cuda.current_device()
        # Match by PCI bus id: CUDA and NVML order devices differently under CUDA_VISIBLE_DEVICES.
        try:
            props: Any = torch.cuda.get_device_properties(idx)
            bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            return nvml.nvmlDeviceGetHandleByPciBusId(bus.encode())
        except Exception:
            return nvml.nvmlDeviceGetHandleByIndex(idx)

    def power_w(self) -> float:
        """Board power now, watts."""
        return float(self._nvml.nvmlDeviceGetPowerUsage(self._handle)) / 1e3

    def energy_j(self) -> float:
        """The board's total-energy counter, joules."""
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1e3

    def sm_clock_mhz(self) -> float:
        """The SM clock now, MHz."""
        nvml = self._nvml
        return float(nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM))

    def clock_sampler(self, interval_s: float = 0.005) -> ClockSampler:
        """A :class:`ClockSampler` of the SM clock (one that records nothing when clocks are unavailable)."""
        return ClockSampler(self.sm_clock_mhz if (self.available and self.clock_available) else None, interval_s)

    def measure_idle(self, seconds: float = 0.5) -> float | None:
        """Mean board power with the device idle (called once, before replay)."""
        if not self.available:
            return None
        samples = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            samples.append(self.power_w())
            time.sleep(0.01)
        self.idle_w = sum(samples) / len(samples) if samples else None
        return self.idle_w

    def measure(self, fn: Callable[[], Any], sync: Callable[[], None], window_s: float = 0.3) -> EnergyStats:
        """Run ``fn`` back to back for about ``window_s`` and return the energy per call."""
        if not self.available:
            raise RuntimeError(self.why)
        # Size the window in calls from a short probe so the loop does not check the clock per call.
        sync()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        sync()
        per_call = max((time.perf_counter() - t0) / 3, 1e-7)
        calls = max(1, int(window_s / per_call))
        samples: list[tuple[float, float]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append((time.perf_counter(), self.power_w()))
                time.sleep(0.005)

        thread = threading.Thread(target=sample, daemon=True)
        e0 = self.energy_j() if self._counter else 0.0
        start = time.perf_counter()
        thread.start()
        for _ in range(calls):
            fn()
        sync()
        elapsed = time.perf_counter() - start
        e1 = self.energy_j() if self._counter else 0.0
        stop.set()
        thread.join(timeout=1.0)
        if self._counter and e1 > e0:
            joules = e1 - e0
            method = "energy_counter"
        else:
            joules = _integrate(samples, start, start + elapsed)
            method = "power_samples"
        avg_w = joules / elapsed if elapsed > 0 else 0.0
        dynamic = None
        if self.idle_w is not None:
            dynamic = max(0.0, (joules - self.idle_w * elapsed) / calls)
        return EnergyStats(
            joules_per_call=joules / calls,
            dynamic_joules_per_call=dynamic,
            avg_power_w=avg_w,
            window_s=elapsed,
            calls=calls,
            method=method,
        )

    def close(self) -> None:
        """Release NVML."""
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None
            self.available = False
            self.clock_available = False


class ClockSampler:
    """Samples ``read()`` (a clock, MHz) on a daemon thread, only inside :meth:`window` blocks.

    Use as ``with sampler:`` (starts and stops the thread) around code that opens a ``with
    sampler.window():`` around the stretches when the device is busy (the timer does, per profiler
    session), so idle moments between them (profiler parsing) do not count. A reading is taken when
    each window opens and closes, so even a short one has samples. With ``read`` ``None`` (no NVML)
    nothing is read and :attr:`median` is ``None``; a failing read stops the sampling.
    """

    def __init__(self, read: Callable[[], float] | None, interval_s: float = 0.005) -> None:
        self._read = read
        self._interval = max(interval_s, 0.0005)
        self.samples: list[float] = []
        """Readings taken."""
        self._active = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _take(self) -> bool:
        if self._read is None:
            return False
        try:
            self.samples.append(float(self._read()))
        except Exception:
            self._read = None
            return False
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._active.wait(0.05):
                continue
            if self._stop.wait(self._interval):
                return
            if self._active.is_set() and not self._take():
                return

    def __enter__(self) -> ClockSampler:
        if self._read is not None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="opgraph-clock", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._active.clear()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        """Sample while the block runs (the device is busy)."""
        self._take()
        self._active.set()
        try:
            yield
        finally:
            self._active.clear()
            self._take()

    @property
    def median(self) -> float | None:
        """Median reading, or ``None`` without readings."""
        return statistics.median(self.samples) if self.samples else None


def _integrate(samples: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Trapezoidal integral of (time, watts) samples over ``[t0, t1]``, joules."""
    pts = [(t, w) for t, w in samples if t0 <= t <= t1]
    if not pts:
        return 0.0
    if len(pts) == 1:
        return pts[0][1] * (t1 - t0)
    total = sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in itertools.pairwise(pts))
    # Extend the ends flat to the window's edges.
    total += (pts[0][0] - t0) * pts[0][1] + (t1 - pts[-1][0]) * pts[-1][1]
    return total
