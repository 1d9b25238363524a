"""``opgraph.trace.kineto``: raw Kineto events read with the importer's categories."""

from __future__ import annotations

import doctest

import opgraph.trace.kineto as kineto
from opgraph.trace.kineto import is_device_event, is_launch_event, launch_times


def test_doctests() -> None:
    assert doctest.testmod(kineto).failed == 0


def test_device_and_launch_events_follow_the_span_categories() -> None:
    device = [{"ph": "X", "cat": c} for c in ("kernel", "gpu_memcpy", "gpu_memset", "memcpy")]
    host = [{"ph": "X", "cat": c} for c in ("cpu_op", "cuda_runtime", "user_annotation", "gpu_user_annotation")]
    assert all(is_device_event(e) for e in device) and not any(is_device_event(e) for e in host)
    assert not is_device_event({"ph": "i", "cat": "kernel"})  # an instant event is no device time
    assert not is_device_event({"ph": "X", "cat": "ac2g"})  # a category the importer does not read
    launches = [
        {"ph": "X", "cat": c, "args": {"correlation": 1}} for c in ("cuda_runtime", "cuda_driver", "hip_runtime")
    ]
    assert all(is_launch_event(e) for e in launches)
    assert not is_launch_event({"ph": "X", "cat": "cuda_runtime", "args": {}})  # no correlation: launches nothing
    assert not is_launch_event({"ph": "X", "cat": "kernel", "args": {"correlation": 1}})


def test_launch_times_map_each_correlation_to_its_host_call() -> None:
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "args": {"correlation": 3}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": "12.5", "args": {"correlation": 4}},
        {"ph": "X", "cat": "kernel", "ts": 20, "args": {"correlation": 3}},
        {"ph": "X", "cat": "cpu_op", "ts": 9, "args": {"correlation": 5}},
    ]
    assert launch_times(events) == {3: 10.0, 4: 12.5}
