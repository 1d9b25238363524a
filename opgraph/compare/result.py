"""The comparison's result models (a :class:`Comparison` and its rows), the join modes and errors.

Shared by the timeline join (:mod:`opgraph.compare.compare`) and the measured-trace join
(:mod:`opgraph.compare.measured`), so neither imports the other's module for them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from opgraph.ir import OpgraphError
from opgraph.ir.tensor import FrozenModel

MIN_OP_US = 5.0
"""Ops shorter than this (in the reference) are left out of the median per-op error, as in the targets."""


def _infinite_if_none(value: object) -> object:
    return math.inf if value is None else value


RelError = Annotated[float, BeforeValidator(_infinite_if_none)]
"""(predicted - reference) / reference: infinite when there is no reference time, which JSON saves as null
(read back as infinite)."""


class CompareError(OpgraphError):
    """The two timelines cannot be compared (nothing to join, different models, empty)."""


class JoinMode(str, Enum):
    """How spans of the two timelines are matched."""

    AUTO = "auto"
    OP_ID = "op_id"
    DEFINITION = "definition"
    TRACE = "trace"
    """A measured trace without op ids: steps by stage and order, layers, then ops by aten call or kinds."""


class OpError(FrozenModel):
    """One matched op (or kernel group): predicted versus reference device time."""

    key: str
    """Op id (``op 12``) or ``definition#occurrence``."""
    op_id: int | None = None
    definition: str = ""
    kind: str = ""
    layer: int | None = None
    stage: str = ""
    step: int | None = None
    """Forward pass (simulated step) the op or group belongs to, when known."""
    predicted_us: float
    reference_us: float

    @property
    def error_us(self) -> float:
        """Predicted minus reference."""
        return self.predicted_us - self.reference_us

    @property
    def rel_error(self) -> float:
        """Relative error against the reference (``inf`` when the reference is 0)."""
        return self.error_us / self.reference_us if self.reference_us else math.inf


class GroupError(FrozenModel):
    """Totals of one group (a kind, a layer, a stage): its matched ops and the time of either side that
    found no partner, so that the groups of a table add up to the end-to-end device time."""

    group: str
    ops: int
    """Matched ops (or kernel groups) in the group."""
    predicted_us: float
    """Predicted device time of the group, unmatched time included."""
    reference_us: float
    """Reference device time of the group, unmatched time included."""
    rel_error: RelError
    """(predicted - reference) / reference."""
    unmatched_predicted_us: float = 0.0
    """Part of ``predicted_us`` with no reference partner."""
    unmatched_reference_us: float = 0.0
    """Part of ``reference_us`` with no predicted partner."""


class ErrorRow(FrozenModel):
    """An end-to-end figure."""

    metric: str
    predicted_us: float
    reference_us: float
    rel_error: RelError


class StepError(FrozenModel):
    """One simulated step (forward pass) against the trace pass matched to it by stage and order."""

    step: int
    stage: str
    pass_index: int | None
    """The trace's pass (None: no pass of that stage left to match)."""
    predicted_us: float
    """Device time of the step."""
    reference_us: float
    predicted_wall_us: float
    """From the step's first to its last device span."""
    reference_wall_us: float
    rel_error: RelError


class Comparison(FrozenModel):
    """The result of comparing a predicted timeline with a reference timeline (``opgraph compare --json``, the
    ``comparison.json`` of ``opgraph validate``; read one back with ``opgraph.ir.load_model(path, Comparison)``)."""

    schema_version: Literal[1] = 1
    """Format version; the loader refuses other versions with a clear message."""
    predicted: str
    """Label of the predicted timeline."""
    reference: str
    """Label of the reference timeline."""
    join: JoinMode
    matched: int
    """Ops (or kernel groups) matched."""
    unmatched_predicted: int
    """Predicted ops (or kernel groups, or spans without an op) with no partner."""
    unmatched_reference: int
    """Reference ops (or kernels, or kernel groups) with no partner."""
    unmatched_predicted_us: float
    """Device time of predicted spans with no partner."""
    unmatched_reference_us: float
    """Device time of reference spans with no partner."""
    end_to_end: tuple[ErrorRow, ...]
    """Device time (``gpu_time``: summed device spans) and wall time (``wall_time``: the timeline's
    ``wall_us`` when set, else from its first to its last span, host spans included), predicted vs
    reference."""
    median_abs_rel_error: float | None
    """Median |relative error| over matched ops of at least ``MIN_OP_US`` in the reference."""
    by_kind: tuple[GroupError, ...] = ()
    """Matched and unmatched time by op kind: each side's rows add up to its compared device time."""
    by_layer: tuple[GroupError, ...] = ()
    by_stage: tuple[GroupError, ...] = ()
    top_gaps: tuple[OpError, ...] = ()
    """Matched ops that explain most of the absolute gap, largest first."""
    ops: tuple[OpError, ...] = Field(default=(), repr=False)
    """Every matched op."""
    unmatched: tuple[OpError, ...] = Field(default=(), repr=False)
    """Device time with no partner, by step, layer, stage and kind (the other side 0)."""
    by_step: tuple[StepError, ...] = ()
    """Per simulated step, against its trace pass (measured traces)."""
    level: str = ""
    """Finest level matched against a measured trace: ``op`` (aten calls) or ``layer`` (step, layer, kind)."""
    matched_share: float | None = None
    """Share of the reference's device time that matched a predicted op or group (measured traces)."""
    rank: int | None = None
    """Rank compared when either side has several."""
    notes: tuple[str, ...] = ()
    """How the comparison was made: ranks, steps and what could not be matched."""

    def row(self, metric: str) -> ErrorRow:
        """The end-to-end row named ``metric`` (``gpu_time`` or ``wall_time``)."""
        for r in self.end_to_end:
            if r.metric == metric:
                return r
        raise KeyError(metric)


def _rel(pred: float, ref: float) -> float:
    return (pred - ref) / ref if ref else (0.0 if pred == 0 else math.inf)


def _group(errors: Sequence[OpError], attr: str, unmatched: Sequence[OpError] = ()) -> tuple[GroupError, ...]:
    """Matched ``errors`` and ``unmatched`` time grouped by the entries' ``attr`` (``-`` for none)."""
    acc: dict[str, list[float]] = {}
    for entries, lone in ((errors, False), (unmatched, True)):
        for e in entries:
            value = getattr(e, attr)
            name = "-" if value in (None, "") else str(value)
            row = acc.setdefault(name, [0, 0.0, 0.0, 0.0, 0.0])
            row[1] += e.predicted_us
            row[2] += e.reference_us
            if lone:
                row[3] += e.predicted_us
                row[4] += e.reference_us
            else:
                row[0] += 1

    def order(item: tuple[str, list[float]]) -> tuple[int, float, str]:
        # layers in order; other groups by reference time, then those only predicted by predicted time
        name, row = item
        if name.lstrip("-").isdigit():
            return (0, float(name), "")
        return (1, -row[2], name) if row[2] else (2, -row[1], name)

    return tuple(
        GroupError(
            group=name,
            ops=int(r[0]),
            predicted_us=r[1],
            reference_us=r[2],
            rel_error=_rel(r[1], r[2]),
            unmatched_predicted_us=r[3],
            unmatched_reference_us=r[4],
        )
        for name, r in sorted(acc.items(), key=order)
    )
