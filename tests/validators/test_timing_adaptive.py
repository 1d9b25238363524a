"""The kernels timer's logic on the CPU: the stopping rule, range attribution, adaptive sessions, clocks."""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd.profiler_util import FunctionEvent as _FunctionEvent
from torch.profiler import ProfilerActivity, profile, record_function

from validators import timing as timing_mod
from validators.energy import ClockSampler, EnergyMeter
from validators.timing import OP_RANGE, CudaTimer, TimingConfig, ci_rel, range_kernel_us, stop_sampling

FunctionEvent: Any = _FunctionEvent  # untyped in torch
CPU = torch.autograd.DeviceType.CPU  # type: ignore[attr-defined]
CUDA = torch.autograd.DeviceType.CUDA  # type: ignore[attr-defined]

samples = st.lists(st.floats(min_value=1.0, max_value=1e4, allow_nan=False), min_size=1, max_size=40)


def first_stop(xs: list[float], min_n: int, max_n: int, target: float) -> int:
    """How many samples the rule takes from ``xs`` (``len(xs) + 1`` if it never stops within them)."""
    for n in range(1, len(xs) + 1):
        if stop_sampling(xs[:n], min_n=min_n, max_n=max_n, target_ci=target):
            return n
    return len(xs) + 1


@settings(max_examples=60, deadline=None)
@given(xs=samples, min_n=st.integers(1, 12), extra=st.integers(0, 20), target=st.floats(0.0, 0.05))
def test_never_before_minimum_always_by_maximum(xs: list[float], min_n: int, extra: int, target: float) -> None:
    max_n = min_n + extra
    n = first_stop(xs, min_n, max_n, target)
    assert n >= min_n or n == len(xs) + 1
    if len(xs) >= max_n:
        assert n <= max_n
    # The time cap stops as soon as the minimum is in, never before it.
    for k in range(1, len(xs) + 1):
        timed_out = stop_sampling(xs[:k], min_n=min_n, max_n=max_n, target_ci=target, elapsed_s=9.0, max_time_s=1.0)
        assert timed_out == (k >= min_n)


@settings(max_examples=60, deadline=None)
@given(xs=samples, shrink=st.floats(0.0, 0.99), target=st.floats(0.001, 0.05), min_n=st.integers(2, 9))
def test_tighter_samples_stop_no_later(xs: list[float], shrink: float, target: float, min_n: int) -> None:
    c = statistics.median(xs)
    tight = [c + shrink * (x - c) for x in xs]
    assert first_stop(tight, min_n, 10**6, target) <= first_stop(xs, min_n, 10**6, target)


def test_ci_rel_values() -> None:
    assert ci_rel([5.0] * 9) == 0.0
    assert ci_rel([1.0]) == float("inf")
    xs = [90.0, 95.0, 100.0, 105.0, 110.0]
    assert ci_rel(xs) == pytest.approx(1.57 * 10.0 / 5**0.5 / 100.0)
    assert stop_sampling([100.0, 100.1, 99.9], min_n=3, max_n=25, target_ci=0.005)
    assert not stop_sampling([100.0, 150.0, 60.0], min_n=3, max_n=25, target_ci=0.005)


def _cpu_event(name: str, eid: int, start: float, end: float, kernels: Sequence[tuple[str, float]] = ()) -> Any:
    e = FunctionEvent(id=eid, name=name, thread=1, start_us=start, end_us=end, use_device="cuda", device_type=CPU)
    for kname, dur in kernels:
        e.append_kernel(kname, 0, dur)
    return e


def _device_event(name: str, eid: int, start: float, dur: float) -> Any:
    return FunctionEvent(
        id=eid, name=name, thread=7, start_us=start, end_us=start + dur, use_device="cuda", device_type=CUDA
    )


def test_range_kernels_are_the_ops_own() -> None:
    flush = _cpu_event("aten::max", 1, 0, 5, [("reduce_kernel", 40.0)])
    rng = _cpu_event(OP_RANGE, 2, 10, 30, [(OP_RANGE, 99.0)])  # a device-side annotation linked to the range
    mm = _cpu_event("aten::mm", 3, 11, 20, [("gemm_kernel", 7.0)])
    add = _cpu_event("aten::add", 4, 21, 29, [("add_kernel", 2.0), ("add_tail", 1.0)])
    for child in (mm, add):
        rng.append_cpu_child(child)
        child.set_cpu_parent(rng)
    device = [
        _device_event("reduce_kernel", 5, 0, 40.0),
        _device_event("gemm_kernel", 6, 41, 7.0),
        _device_event("add_kernel", 7, 48, 2.0),
        _device_event("add_tail", 8, 50, 1.0),
        _device_event(OP_RANGE, 9, 41, 10.0),  # gpu_user_annotation span: not a kernel
    ]
    inside, total, ranges = range_kernel_us([flush, rng, mm, add, *device])
    assert inside == pytest.approx(10.0)
    assert total == pytest.approx(50.0)
    assert ranges == 1
    # torch's own sum over the subtree agrees once the annotation is left out.
    assert rng.device_time_total - 99.0 == pytest.approx(inside)


def test_a_kernel_an_overhead_event_lists_too_counts_once() -> None:
    # As torch 2.11 recorded it on an H100: the CUPTI buffer request under the op lists the op's kernel
    # again (their ids collided), so a walk of the range's subtree saw it twice.
    rng = _cpu_event(OP_RANGE, 2, 10, 30)
    mm = _cpu_event("aten::mm", 3, 11, 20, [("gemm_kernel", 90.0)])
    buffer = _cpu_event("Activity Buffer Request", 4, 12, 19, [("gemm_kernel", 90.0)])
    rng.append_cpu_child(mm)
    mm.set_cpu_parent(rng)
    mm.append_cpu_child(buffer)
    buffer.set_cpu_parent(mm)
    inside, total, _ = range_kernel_us([rng, mm, buffer, _device_event("gemm_kernel", 5, 40, 90.0)])
    assert inside == pytest.approx(90.0) == pytest.approx(total)
    assert rng.device_time_total == pytest.approx(180.0)  # torch's own sum counts it twice


def test_range_events_from_the_real_profiler() -> None:
    """The installed torch records one CPU-side range per call, with the op's aten calls under it."""
    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            x.max()
            with record_function(OP_RANGE):
                torch.mm(x, x)
    events = prof.events()
    ranges = [e for e in events if e.name == OP_RANGE]
    assert len(ranges) == 4
    assert all(any("mm" in c.name for c in r.cpu_children) for r in ranges)
    assert all(not any("max" in c.name for c in r.cpu_children) for r in ranges)
    assert range_kernel_us(events)[2] == 4


class _FakeProfiler:
    """Stands in for ``torch.profiler.profile``: events from the calls made while it was active."""

    def __init__(self, log: dict[str, Any]) -> None:
        self.log = log

    def __call__(self, activities: Any = None) -> _FakeProfiler:
        return self

    def __enter__(self) -> _FakeProfiler:
        self.log["calls"] = 0
        self.log["preps"] = 0
        self.log["sessions"] += 1
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def events(self) -> list[Any]:
        n, preps, per_call = self.log["calls"], self.log["preps"], self.log["per_call"]
        out: list[Any] = []
        t = 0.0
        us = per_call(self.log["sessions"])
        for i in range(n):
            r = _cpu_event(OP_RANGE, 10 * i + 1, t, t + 1)
            k = _cpu_event("aten::mm", 10 * i + 2, t, t + 1, [] if self.log["lost"] else [("k", us)])
            r.append_cpu_child(k)
            out += [r, k, _device_event("k", 10 * i + 3, t, us)]
            t += 2
        for i in range(preps):
            out.append(_device_event("flush", 10**6 + i, t, 30.0))
        return out


def _run_kernels_timer(
    monkeypatch: pytest.MonkeyPatch, per_call: Callable[[int], float], cfg: TimingConfig, *, lost: bool = False
) -> tuple[Any, dict[str, Any]]:
    log: dict[str, Any] = {"sessions": 0, "calls": 0, "preps": 0, "per_call": per_call, "lost": lost}
    monkeypatch.setattr(torch.profiler, "profile", _FakeProfiler(log))
    timer = CudaTimer(torch.device("cpu"))
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda *a: None))

    def op() -> None:
        log["calls"] += 1

    def prepare() -> None:
        log["preps"] += 1

    stats = timer._time_kernels(op, cfg, fake_torch, prepare, warm=3, host_us=5.0, rough_us=1000.0)
    return stats, log


def test_adaptive_sessions_stop_at_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = TimingConfig(cold_l2=True, kernel_sessions=9, max_kernel_sessions=25, target_ci=0.005)
    steady, log = _run_kernels_timer(monkeypatch, lambda s: 100.0, cfg)
    assert steady.samples == 9 and log["sessions"] == 9
    assert steady.median_us == pytest.approx(100.0)  # the flush (30 us a call) is not in it
    assert steady.attribution == "range" and steady.timer == "cuda_kernels" and steady.converged
    noisy, _ = _run_kernels_timer(monkeypatch, lambda s: 100.0 * (1.0 + 0.2 * (s % 3)), cfg)
    assert noisy.samples == 25 and not noisy.converged
    settling, _ = _run_kernels_timer(monkeypatch, lambda s: 110.0 if (s <= 9 and s % 2) else 100.0, cfg)
    assert 9 < settling.samples < 25 and settling.converged


def test_subtraction_fallback_when_no_kernel_lands_in_a_range(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = TimingConfig(cold_l2=True, kernel_sessions=3, max_kernel_sessions=3)
    stats, _ = _run_kernels_timer(monkeypatch, lambda s: 100.0, cfg, lost=True)
    assert stats.attribution == "subtracted"
    assert stats.median_us == pytest.approx(100.0)  # 130 us of kernels a call less the 30 us flush


def test_read_view_reads_any_dtype() -> None:
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16]
    dtypes += [torch.float32, torch.float64, getattr(torch, "float8_e4m3fn", torch.float16)]
    for dt in dtypes:
        base = torch.ones(6, 4, dtype=torch.float32).to(dt)
        t = base.t()  # non-contiguous: the view keeps shape and strides
        v = timing_mod.read_view(t)
        assert v is not None and not v.dtype.is_floating_point and v.dtype != torch.bool
        assert v.shape == t.shape and v.stride() == t.stride() and v.element_size() == t.element_size()
        timing_mod.touch([v])
    assert timing_mod.read_view(torch.zeros(0, 3)) is None
    assert timing_mod.read_view(torch.zeros(3, dtype=torch.complex64)) is None
    assert timing_mod.read_view(3.0) is None


def test_clock_sampler_reads_only_inside_windows() -> None:
    busy = {"on": False}
    readings: list[bool] = []

    def read() -> float:
        readings.append(busy["on"])
        return 1980.0 if busy["on"] else 345.0

    with ClockSampler(read, interval_s=0.001) as s:
        time.sleep(0.02)  # idle: no readings
        with s.window():
            busy["on"] = True
            time.sleep(0.02)
            busy["on"] = False
        time.sleep(0.02)
    assert s.median is not None and len(s.samples) >= 2
    assert s.samples.count(345.0) <= 2  # at most the readings as the window opens and closes
    assert s.median == 1980.0 or len(s.samples) == 2
    with ClockSampler(None) as none, none.window():
        pass
    assert none.median is None and none.samples == []

    def broken() -> float:
        raise RuntimeError("gone")

    with ClockSampler(broken) as b, b.window():
        pass
    assert b.median is None


def test_kernels_timer_samples_clocks_per_session(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[int] = []

    class Clock:
        @contextlib.contextmanager
        def window(self) -> Iterator[None]:
            opened.append(1)
            yield

    log: dict[str, Any] = {"sessions": 0, "calls": 0, "preps": 0, "per_call": lambda s: 50.0, "lost": False}
    monkeypatch.setattr(torch.profiler, "profile", _FakeProfiler(log))
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda *a: None))
    cfg = TimingConfig(kernel_sessions=4, max_kernel_sessions=4)
    CudaTimer(torch.device("cpu"))._time_kernels(
        lambda: log.__setitem__("calls", log["calls"] + 1), cfg, fake_torch, None, warm=1, host_us=1.0,
        rough_us=100.0, busy=Clock(),
    )  # fmt: skip
    assert len(opened) == log["sessions"] == 4


def test_energy_meter_reads_sm_clock_with_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("pynvml")
    mod.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    mod.nvmlInit = lambda: None  # type: ignore[attr-defined]
    mod.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetPowerUsage = lambda _h: 100_000  # type: ignore[attr-defined]
    mod.nvmlDeviceGetClockInfo = lambda _h, kind: 1980 if kind == 1 else 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    meter = EnergyMeter(torch.device("cuda", 0))
    assert meter.available and meter.clock_available
    with meter.clock_sampler(0.001) as s, s.window():
        pass
    assert s.median == 1980.0
    meter.close()
    with meter.clock_sampler() as after, after.window():
        pass
    assert after.median is None
    del mod.nvmlDeviceGetClockInfo  # an NVML without clock queries: energy still works, no clocks
    meter = EnergyMeter(torch.device("cuda", 0))
    assert meter.available and not meter.clock_available


@pytest.mark.cuda
def test_gpu_range_attribution_and_warm_activations() -> None:
    """On a GPU: the range holds exactly the op's kernels; warm activations make a norm no slower.

    ``pytest -q -s -m cuda tests/validators/test_timing_adaptive.py`` prints the numbers.
    """
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from opgraph.ir import AtenCall, DType, Gemm, Norm, TensorSpec
    from validators.configs import OpConfig, config_key
    from validators.replay import Replayer, ReplayOptions

    dev = torch.device("cuda")
    a = torch.randn(2048, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    flush = torch.zeros(64 * 2**20, dtype=torch.int32, device=dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            flush.max()
            with record_function(OP_RANGE):
                torch.mm(a, b)
        torch.cuda.synchronize()
    events = prof.events()
    inside, total, ranges = range_kernel_us(events)

    # The ranges hold the GEMM's kernels, all of them and nothing else; every other kernel is the flush's
    # (its reduction and memset). Counted from the device's own events: a CPU event's device_time_total
    # can count a kernel twice (torch 2.11 lists the flush's kernels under an "Activity Buffer Request" too).
    def subtree(e: Any) -> list[Any]:
        return [e, *(d for c in e.cpu_children for d in subtree(c))]

    ranges_cpu = [e for e in events if e.name == OP_RANGE and str(e.device_type).endswith("CPU")]
    in_range = {k.name for e in ranges_cpu for ev in subtree(e) for k in ev.kernels}
    device = [e for e in events if not str(e.device_type).endswith("CPU") and e.name != OP_RANGE]
    gemm = sum(e.time_range.elapsed_us() for e in device if e.name in in_range)
    outside = sum(e.time_range.elapsed_us() for e in device if e.name not in in_range)
    print(f"\nrange {inside / 20:.1f} us/call, flush {outside / 20:.1f} us/call, all kernels {total / 20:.1f} us/call")
    assert ranges == 20 and inside > 0
    assert not any("reduce" in n or "Memset" in n for n in in_range)
    assert inside == pytest.approx(gemm, rel=0.005)
    assert inside + outside == pytest.approx(total, rel=0.005)

    bf = DType.bf16
    s, h, v = 2048, 4096, 128256
    norm = Norm(
        id=0,
        target="LlamaRMSNorm",
        rows=s,
        hidden=h,
        inputs=(TensorSpec(shape=(1, s, h), dtype=bf), TensorSpec(shape=(h,), dtype=bf)),
    )
    x_spec, w_spec = TensorSpec(shape=(s, h), dtype=bf), TensorSpec(shape=(h, v), dtype=bf, strides=(1, h))
    mm_call = AtenCall(args=({"tensor": 0}, {"tensor": 1}))
    gemm = Gemm(id=1, target="aten.mm.default", m=s, n=v, k=h, dtype=bf, inputs=(x_spec, w_spec),
                outputs=(TensorSpec(shape=(s, v), dtype=bf),), call=mm_call)  # fmt: skip
    medians: dict[tuple[str, bool, bool], float] = {}
    for cold, warm in [(False, True), (True, False), (True, True)]:
        opts = ReplayOptions(check=False, energy=False, timing=TimingConfig(cold_l2=cold, warm_activations=warm))
        rep = Replayer("cuda", opts)
        try:
            for op in (norm, gemm):
                r = rep.replay(OpConfig(key=config_key(op), op=op, count=1, warm_inputs=(0,)))
                assert r.timing is not None, r.reason
                t = r.timing
                print(f"{op.definition:24} cold_l2={cold!s:5} warm={warm!s:5} median {t.median_us:9.2f} us "
                      f"spread {100 * t.spread:5.2f}% sessions {t.samples:2} {t.attribution} warmed {t.warm_inputs} "
                      f"sm {t.sm_clock_mhz} MHz")  # fmt: skip
                assert t.timer == "cuda_kernels" and t.attribution == "range"
                assert t.warm_inputs == ((0,) if cold and warm else None)
                medians[(op.definition, cold, warm)] = t.median_us
        finally:
            rep.close()
    assert medians[(norm.definition, True, True)] <= 1.02 * medians[(norm.definition, True, False)]


def test_issue_time_is_timed_beside_a_reference_call_in_the_same_bursts() -> None:
    """The reference (a one-element add) is issued in each burst the op is: the host's speed then."""
    order: list[str] = []

    class _Ref:
        def add_(self, _: int) -> None:
            order.append("ref")

    fake_torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(synchronize=lambda *a: order.append("sync")), zeros=lambda *a, **k: _Ref()
    )
    timer = CudaTimer(torch.device("cpu"))
    host_us, ref_us = timer._issue_us(lambda: order.append("op"), fake_torch, bursts=3, calls=2)
    assert host_us >= 0 and ref_us >= 0
    assert order == ["sync", "op", "op", "sync", "ref", "ref"] * 3 + ["sync"]
