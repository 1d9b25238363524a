"""Raw Kineto (Chrome trace JSON) events, read with the importer's categories.

For scripts that read a torch-profiler trace's events directly (the GPU benchmarks split a trace
into runs, steps or forwards): which events are device work, which are the host calls that launch
it, and when each device event was launched. Categories are those of
:class:`~opgraph.ir.SpanCategory` (device time is kernels, copies and fills; ``cuda_runtime``,
``cuda_driver`` and ``hip_runtime`` are launches), so every script counts the same events as
``opgraph compare`` and ``opgraph analyze``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from opgraph.ir.timeline import SpanCategory


@lru_cache(maxsize=256)
def _category(cat: str) -> SpanCategory | None:
    try:
        return SpanCategory.parse(cat)
    except ValueError:  # a category the importer does not read (flow events, ...)
        return None


def is_device_event(event: Mapping[str, Any]) -> bool:
    """Whether ``event`` is a complete event of device work (a kernel, a copy, a fill).

    >>> is_device_event({"ph": "X", "cat": "kernel"}), is_device_event({"ph": "X", "cat": "cpu_op"})
    (True, False)
    """
    category = _category(str(event.get("cat", "")))
    return event.get("ph") == "X" and category is not None and category.is_device


def is_launch_event(event: Mapping[str, Any]) -> bool:
    """Whether ``event`` is a host runtime or driver call with a correlation id (what launches device
    work: ``cudaLaunchKernel``, ``cuLaunchKernelEx``, ``hipLaunchKernel``, a copy...).

    >>> is_launch_event({"ph": "X", "cat": "cuda_driver", "args": {"correlation": 7}})
    True
    """
    args = event.get("args")
    return (
        event.get("ph") == "X"
        and _category(str(event.get("cat", ""))) is SpanCategory.RUNTIME
        and isinstance(args, Mapping)
        and "correlation" in args
    )


def launch_times(events: Iterable[Mapping[str, Any]]) -> dict[Any, float]:
    """Host time (the trace's microseconds) of each launch, by correlation id: a device event's
    ``args.correlation`` finds the call that launched it.

    >>> launch_times([{"ph": "X", "cat": "cuda_runtime", "ts": 5, "args": {"correlation": 1}},
    ...               {"ph": "X", "cat": "kernel", "ts": 9, "args": {"correlation": 1}}])
    {1: 5.0}
    """
    return {e["args"]["correlation"]: float(e["ts"]) for e in events if is_launch_event(e)}
