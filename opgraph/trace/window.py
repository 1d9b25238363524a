"""Device events at a trace's start that ran work launched before the profiler window opened.

A window that opens inside a step records the tail of the work queued before it: device events whose
launch is not in the trace. They are not the trace's own work. The analyzer sets them apart (in no pass
or layer, and out of every total and table), ``opgraph compare`` and
:func:`~opgraph.trace.attribute_kernels` leave them out, and an imported timeline marks their spans with
:data:`WINDOW_ARG`. All of them find them with :func:`window_leftovers`.
"""

from __future__ import annotations

from collections.abc import Sequence

from opgraph.trace.events import GpuEvent, HostEvent

WINDOW_ARG = "launched_before_window"
"""Span arg, ``True`` on every device span of an imported timeline that :func:`window_leftovers` counts (the
spans also carry no launch, pass, layer or stage)."""

WINDOW_PHRASE = "at the start ran work launched before the profiler window opened"
"""The words every note about these events holds (a timeline's note is dropped when the analysis says it again)."""


def window_leftovers(gpu: Sequence[GpuEvent], host: Sequence[HostEvent]) -> int:
    """How many device events at the start of the trace were launched before the profiler window opened:
    the leading run of events without a launch, in a trace whose later events do have one. With CUDA-graph
    launches in the trace only events that start before the first graph launch count (graph kernels may
    lack a link of their own)."""
    first_linked = next((i for i, g in enumerate(gpu) if g.launch_ts is not None), None)
    if not first_linked:
        return 0
    graph_launch = min((h.ts for h in host if h.kind == "runtime" and "GraphLaunch" in h.name), default=None)
    if graph_launch is None:
        return first_linked
    return sum(1 for g in gpu[:first_linked] if g.ts < graph_launch)


def window_note(gpu: Sequence[GpuEvent], skip: int, consequence: str) -> str:
    """The note on the first ``skip`` events of ``gpu`` (their count, kernels and time), then ``consequence``:
    what the reader does with them."""
    kernels = sum(1 for g in gpu[:skip] if g.kind == "kernel")
    ms = sum(g.dur for g in gpu[:skip]) / 1000
    return (
        f"{skip} device events ({kernels} kernels, {ms:.3f} ms) {WINDOW_PHRASE} (no launch in the trace): "
        + consequence
    )
