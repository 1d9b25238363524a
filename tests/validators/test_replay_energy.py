"""Energy per call from NVML (with a fake NVML: the arithmetic, the fallbacks) and CPU timing."""

from __future__ import annotations

import sys
import time
import types

import pytest
import torch

from validators.energy import EnergyMeter, _integrate
from validators.timing import TimingConfig, time_cpu

WATTS = 250.0


def _fake_pynvml(counter: bool) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    t0 = time.perf_counter()

    def energy(_h: object) -> int:
        if not counter:
            raise RuntimeError("not supported")
        return int((time.perf_counter() - t0) * WATTS * 1e3)  # millijoules

    mod.nvmlInit = lambda: None  # type: ignore[attr-defined]
    mod.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetPowerUsage = lambda _h: int(WATTS * 1e3)  # type: ignore[attr-defined]  # milliwatts
    mod.nvmlDeviceGetTotalEnergyConsumption = energy  # type: ignore[attr-defined]
    return mod


@pytest.mark.parametrize("counter", [True, False])
def test_energy_per_call_with_fake_nvml(monkeypatch: pytest.MonkeyPatch, counter: bool) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(counter))
    meter = EnergyMeter(torch.device("cuda", 0))
    assert meter.available, meter.why
    assert meter.measure_idle(0.05) == pytest.approx(WATTS)

    def op() -> None:
        time.sleep(0.002)

    stats = meter.measure(op, lambda: None, window_s=0.06)
    assert stats.method == ("energy_counter" if counter else "power_samples")
    assert stats.avg_power_w == pytest.approx(WATTS, rel=0.25)
    assert stats.joules_per_call == pytest.approx(WATTS * stats.window_s / stats.calls, rel=0.25)
    assert stats.dynamic_joules_per_call is not None and stats.dynamic_joules_per_call < 0.25 * stats.joules_per_call
    meter.close()


def test_energy_unavailable_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "CUDA" in EnergyMeter(torch.device("cpu")).why
    monkeypatch.setitem(sys.modules, "pynvml", None)
    meter = EnergyMeter(torch.device("cuda", 0))
    assert not meter.available and "nvidia-ml-py" in meter.why


def test_integrate_trapezoid() -> None:
    samples = [(1.0, 100.0), (2.0, 200.0), (3.0, 200.0)]
    assert _integrate(samples, 1.0, 3.0) == pytest.approx(150.0 + 200.0)
    assert _integrate(samples, 0.0, 3.0) == pytest.approx(350.0 + 100.0)
    assert _integrate([], 0.0, 1.0) == 0.0


def test_cpu_timer_batches_short_calls() -> None:
    cfg = TimingConfig(warmup_ms=1, min_samples=3, max_samples=5, max_time_s=0.05, min_sample_us=200.0)
    stats = time_cpu(lambda: None, cfg)
    assert stats.timer == "perf_counter"
    assert stats.calls_per_sample > 1
    assert 3 <= stats.samples <= 5
