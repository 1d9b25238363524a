"""Small timelines and graphs for the exporter tests (integral microseconds, so HTA's rounding is exact)."""

from __future__ import annotations

from opgraph.export.demo import demo_graph, demo_measured, demo_simulated
from opgraph.ir import OpGraph, Span, Timeline, TimelineKind, TimelineSource


def graph(layers: int = 2) -> OpGraph:
    """A Llama-like prefill graph with ``layers`` blocks."""
    return demo_graph(layers=layers, tokens=512, hidden=1024, heads=8, kv_heads=2)


def integral(tl: Timeline) -> Timeline:
    """``tl`` with every start and duration rounded up to whole microseconds (durations at least 1)."""
    spans = tuple(
        s.model_copy(update={"start_us": float(round(s.start_us)), "dur_us": float(max(1, round(s.dur_us)))})
        for s in tl.spans
    )
    return Timeline(source=tl.source, spans=spans, wall_us=tl.wall_us, notes=tl.notes)


def simulated(g: OpGraph, engines: int = 2) -> Timeline:
    """A simulated timeline of ``g`` with a host thread and ``engines`` engines, integral times."""
    return integral(demo_simulated(g, engines=engines))


def measured(g: OpGraph) -> Timeline:
    """A stand-in measured timeline of ``g`` on ``stream 7``, integral times."""
    return integral(demo_measured(g))


def plain(
    spans: list[tuple[str, str, float, float]], kind: TimelineKind = TimelineKind.SIMULATED, name: str = "t"
) -> Timeline:
    """A timeline from ``(name, track, start_us, dur_us)`` tuples, with no op ids."""
    return Timeline(
        source=TimelineSource(kind=kind, name=name),
        spans=tuple(Span(name=n, track=t, start_us=s, dur_us=d) for n, t, s, d in spans),
    )
