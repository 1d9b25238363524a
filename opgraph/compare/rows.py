"""The rows both joins share: end-to-end device and wall time, and the :class:`Comparison` of matched entries
(with the unmatched time in its group tables)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from opgraph.compare.result import Comparison, ErrorRow, OpError, _group, _rel
from opgraph.ir import Timeline


def median(values: Sequence[float]) -> float | None:
    """Median, or None for no values."""
    return statistics.median(values) if values else None


def wall_us(timeline: Timeline) -> float:
    """The wall time of ``timeline``: its ``wall_us`` when set, else its extent from the first to the last
    span, host spans included (what ``wall_time`` means in every comparison)."""
    return timeline.wall_us if timeline.wall_us is not None else timeline.makespan_us


def error_row(metric: str, predicted_us: float, reference_us: float) -> ErrorRow:
    """The end-to-end row ``metric``: predicted against reference, with the relative error."""
    return ErrorRow(
        metric=metric, predicted_us=predicted_us, reference_us=reference_us, rel_error=_rel(predicted_us, reference_us)
    )


def end_to_end(
    predicted: Timeline, reference_device_us: float, reference: Timeline, suffix: str = ""
) -> list[ErrorRow]:
    """The ``gpu_time`` and ``wall_time`` rows of ``predicted`` against the reference's (``suffix``: `` rank1``):
    device time summed over device spans, wall time as :func:`wall_us` gives it on both sides."""
    device_us = sum(s.dur_us for s in predicted.device_spans())
    return [
        error_row(f"gpu_time{suffix}", device_us, reference_device_us),
        error_row(f"wall_time{suffix}", wall_us(predicted), wall_us(reference)),
    ]


def comparison_of(
    predicted: Timeline,
    reference: Timeline,
    errors: Sequence[OpError],
    *,
    top: int,
    unmatched: Sequence[OpError] = (),
    **fields: Any,
) -> Comparison:
    """The :class:`Comparison` of the matched ``errors``: the labels, the groups by kind, layer and stage
    (with the ``unmatched`` time, so that they add up), the ``top`` largest gaps and every op; ``fields`` are
    the join's own (end to end, unmatched counts, median)."""
    return Comparison(
        predicted=predicted.source.name or predicted.source.kind.value,
        reference=reference.source.name or reference.source.kind.value,
        matched=len(errors),
        by_kind=_group(errors, "kind", unmatched),
        by_layer=_group(errors, "layer", unmatched),
        by_stage=_group(errors, "stage", unmatched),
        top_gaps=tuple(sorted(errors, key=lambda e: -abs(e.error_us))[:top]),
        ops=tuple(errors),
        unmatched=tuple(unmatched),
        **fields,
    )
